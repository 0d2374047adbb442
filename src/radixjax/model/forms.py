"""The names of the forms the model and parallel layers run, where the engine's options
and the command lines list them without importing JAX (this module imports nothing)."""

# model/quant.py quantize_params; "gguf": a GGUF's matrices in their blocks
# (model/gguf_blocks.py), any others as w8a16_int8
QUANTIZATIONS = ("none", "w8a8_int8", "w8a16_int8", "gguf")
ATTENTION_BACKENDS = ("auto", "native", "pallas")  # model/backends.py (auto: pallas on a GPU)
MOE_DISPATCH = ("psum", "all_to_all")  # EP forms: parallel/rules.py Layout.moe_dispatch

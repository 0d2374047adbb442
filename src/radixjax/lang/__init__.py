"""The frontend language (SGLang's): programs that interleave text, generation and
choices, fork into parallel branches that share a prefix, and run in batches.

    from radixjax import lang as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=64))

    state = qa.run(question="...", backend=sgl.EngineBackend(engine), temperature=0)
    state["answer"]

Backends: EngineBackend (in process) and RuntimeEndpoint (HTTP, SGLang's native API).
See docs/frontend.md.
"""

from radixjax.lang.backend import Backend, BackendError, EngineBackend, RuntimeEndpoint
from radixjax.lang.choices import (
    Decision,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixjax.lang.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    tools_prompt,
    user,
    user_begin,
    user_end,
)
from radixjax.lang.program import Program, function, set_default_backend
from radixjax.lang.state import ForkGroup, ProgramError, ProgramState

__all__ = [
    "Backend", "BackendError", "Decision", "EngineBackend", "ForkGroup", "Program",
    "ProgramError", "ProgramState", "RuntimeEndpoint", "assistant", "assistant_begin",
    "assistant_end", "function", "gen", "gen_int", "gen_string", "greedy_token_selection",
    "select", "set_default_backend", "system", "system_begin", "system_end",
    "token_length_normalized", "tools_prompt", "unconditional_likelihood_normalized", "user",
    "user_begin", "user_end",
]

"""The routed experts' compute, shared by both EP forms (moe.py's psum, moe_a2a.py):
assignments sorted by expert, SwiGLU as three `jax.lax.ragged_dot`s.

    assignments (T*k)  --sort by expert-->  [ e0 e0 e0 | e1 | e2 e2 | ... | other ]
                                              group_sizes = [3, 1, 2, ...]
    ragged_dot(x_sorted [M, D], we [E, D, F], group_sizes) -> [M, F]; rows past the
    groups (assignments to experts this device does not hold) come out 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def expert_ffn(
    h: jax.Array,  # [T, D] f32
    gates: jax.Array,  # [T, k] f32
    experts: jax.Array,  # [T, k] int32, global expert ids
    we_gate: jax.Array,  # [El, D, F'] the local experts (F' = F or this device's columns)
    we_up: jax.Array,  # [El, D, F']
    we_down: jax.Array,  # [El, F', D]
    first_expert: jax.Array | int,  # global id of local expert 0
) -> jax.Array:
    """sum_k gate * expert_k(h) over the assignments to the local experts -> [T, D] f32."""
    num_tokens, k = experts.shape
    num_local = we_gate.shape[0]
    local = experts.reshape(-1) - first_expert  # [M = T*k]
    mine = (local >= 0) & (local < num_local)
    key = jnp.where(mine, local, num_local)  # other experts sort last
    order = jnp.argsort(key, stable=True)  # [M]
    group_sizes = jnp.bincount(key, length=num_local + 1)[:num_local].astype(jnp.int32)
    token = order // k  # [M] the token of each sorted assignment
    xs = h[token].astype(we_gate.dtype)  # [M, D]

    def dot(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(x.astype(w.dtype), w, group_sizes,
                                  preferred_element_type=jnp.float32)

    act = jax.nn.silu(dot(xs, we_gate)) * dot(xs, we_up)  # [M, F']
    y = dot(act, we_down)  # [M, D], 0 for other experts' rows
    weight = jnp.where(mine, gates.reshape(-1), 0.0)[order]  # [M]
    return jnp.zeros((num_tokens, h.shape[1]), jnp.float32).at[token].add(y * weight[:, None])

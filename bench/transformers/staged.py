"""The staged SmolLM2 weights (stage_gpu.py) back into a transformers model, without the gguf
package: GGUF blocks dequantized (Q8_0: d * q; Q4_1: d * q + m, float32, as gguf computes them),
llama.cpp's names mapped to transformers', and the rotary row interleave of Q and K undone."""
from __future__ import annotations

import json
import os

import numpy as np

_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def dequantize(raw: np.ndarray, kind: str, shape) -> np.ndarray:
    """raw GGUF bytes of one tensor -> float32 array of the numpy shape (GGUF's shape reversed)."""
    rows = tuple(reversed(shape))
    if kind == "F32":
        return raw.view(np.float32).reshape(rows)
    if kind == "Q8_0":  # blocks of 32: float16 d, 32 int8
        blocks = raw.reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(rows)
    if kind == "Q4_1":  # blocks of 32: float16 d, float16 m, 16 bytes: element j low nibble, j + 16 high
        blocks = raw.reshape(-1, 20)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = blocks[:, 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (d * q + m).reshape(rows)
    raise ValueError("staged weights: tensor type %s is not handled" % kind)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores Q and K rows of each head as (2, D/2) interleaved pairs; transformers'
    rotary embedding wants the halves: (heads, D/2, 2) -> (heads, 2, D/2)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def staged_layers(folders) -> int:
    """How many leading transformer layers the staged parts in ``folders`` hold together."""
    present = set()
    for folder in folders:
        with np.load(os.path.join(folder, "weights.npz")) as files:
            for name in json.loads(files["__kinds__"].tobytes().decode()):
                if name.startswith("blk."):
                    present.add(int(name.split(".")[1]))
    count = 0
    while count in present:
        count += 1
    return count


def load_staged(folders, dtype=None, device: str = "cpu"):
    """A LlamaForCausalLM from stage_gpu.py's parts (one folder or a list): the embedding and
    as many leading layers as the parts hold (config.num_hidden_layers says how many)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folders = [folders] if isinstance(folders, str) else list(folders)
    configs = [os.path.join(f, "config.json") for f in folders if os.path.exists(os.path.join(f, "config.json"))]
    if not configs:
        raise ValueError("staged weights: no config.json in %s (the first part)" % folders)
    with open(configs[0]) as f:
        config = {k: v for k, v in json.load(f).items() if k not in ("architectures",)}
    layers = staged_layers(folders)
    config["num_hidden_layers"] = layers
    if config.get("layer_types"):
        config["layer_types"] = config["layer_types"][:layers]
    config = LlamaConfig(**config)
    raw = {}
    for folder in folders:
        files = np.load(os.path.join(folder, "weights.npz"))
        for name, entry in json.loads(files["__kinds__"].tobytes().decode()).items():
            raw[name] = (files[name], entry)
    state = {}
    for name, (data, (kind, shape)) in raw.items():
        if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
            continue
        w = dequantize(data, kind, shape)
        if name == "token_embd.weight":
            state["model.embed_tokens.weight"] = w
            continue
        if name == "output_norm.weight":
            state["model.norm.weight"] = w
            continue
        _, layer, leaf, _ = name.split(".")
        if leaf == "attn_q":
            w = _unpermute(w, config.num_attention_heads)
        elif leaf == "attn_k":
            w = _unpermute(w, config.num_key_value_heads)
        state["model.layers.%s.%s.weight" % (layer, _NAMES[leaf])] = w
    # Built in the wanted dtype, as from_pretrained builds it: buffers computed in float32 (the
    # rotary inv_freq) stay float32; a model cast afterwards would round them and move every
    # position's angle (0.77 in bfloat16 logits against the GGUF model's, measured).
    dtype = dtype or torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
                                                strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
    if missing or unexpected:
        raise ValueError("staged weights: missing %s, unexpected %s" % (missing, unexpected))
    model.tie_weights()
    return model.to(device=device).eval()

"""Stage what bench/transformers/gpu.sh needs on the lent GPU machine, which has no network, no
gguf package, and takes at most 64 MiB of files per call (the GGUF is 92 MiB).

    python3 bench/transformers/stage_gpu.py --text build/kv-text --out .carry/transformers19

writes two parts, each small enough for one call:
  OUT-a/  (54 MB) config.json; tokens.npy, the first --tokens tokens of eval.txt (int32, so no
          tokenizer is needed there); accuracy-inputs.npz, every token id accuracy.py --staged
          needs for --accuracy-tokens tokens per context (eval.txt's, calibrate.txt's and the
          --prompts generation prompts, made by accuracy.text_inputs as accuracy.py --text makes
          them); weights.npz: the embedding, the final norm and layers 0 to --split - 1, exactly
          as the GGUF stores them (Q8_0, Q4_1 and F32 blocks, raw bytes)
  OUT-b/  (44 MB) weights.npz: layers --split to 29, the same way
gpu_check.py and accuracy.py rebuild a LlamaForCausalLM from the parts it is given with ``load_staged`` (the
GGUF's blocks dequantized as gguf does, Q and K rows un-permuted as transformers does): with
both, the whole model; with the first alone, its first --split layers. Before writing, this
script proves the rebuilt model gives the logits of transformers' own GGUF load (cut to the same
layers).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from staged import load_staged  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, help="folder with eval.txt (text.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", type=int, default=10, help="layers in the first part (of 30)")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens.npy's tokens (gpu_check.py)")
    ap.add_argument("--accuracy-tokens", type=int, default=131072,
                    help="evaluated tokens per context accuracy.py --staged can run (--tokens there)")
    ap.add_argument("--prompts", type=int, default=50, help="generation prompts for accuracy.py --staged")
    args = ap.parse_args(argv)

    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import accuracy

    folder, name = accuracy.gguf_location()
    path = os.path.join(folder, name)
    reader = GGUFReader(path)
    parts = [({}, {}), ({}, {})]  # (arrays, kinds) of OUT-a and OUT-b
    for t in reader.tensors:
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        arrays, kinds = parts[int(layer >= args.split)]
        arrays[t.name] = np.asarray(t.data).view(np.uint8).reshape(-1).copy()
        kinds[t.name] = [t.tensor_type.name, [int(n) for n in t.shape]]
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    folders = [args.out + "-a", args.out + "-b"]
    for path, (arrays, kinds) in zip(folders, parts):
        os.makedirs(path, exist_ok=True)
        np.savez(os.path.join(path, "weights.npz"), **arrays,
                 __kinds__=np.frombuffer(json.dumps(kinds).encode(), np.uint8))
    with open(os.path.join(folders[0], "config.json"), "w") as f:
        json.dump(model.config.to_dict(), f, indent=1, default=str)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    with open(os.path.join(args.text, "eval.txt"), encoding="utf-8") as f:
        text = f.read(args.tokens * 8)
    tokens = np.asarray(tok(text).input_ids[: args.tokens], np.int32)
    if tokens.size < args.tokens:
        raise SystemExit("stage_gpu.py: eval.txt gave only %d tokens" % tokens.size)
    np.save(os.path.join(folders[0], "tokens.npy"), tokens)
    inputs = accuracy.text_inputs(args.text, tok, args.accuracy_tokens, args.prompts)
    if inputs["eval"].size < args.accuracy_tokens or len(inputs["prompts"]) < args.prompts:
        raise SystemExit("stage_gpu.py: eval.txt gave only %d tokens and %d prompts" % (inputs["eval"].size,
                                                                                       len(inputs["prompts"])))
    accuracy.save_inputs(os.path.join(folders[0], accuracy.INPUTS), inputs)
    back = accuracy.load_inputs(os.path.join(folders[0], accuracy.INPUTS))
    if not (np.array_equal(back["eval"], inputs["eval"]) and np.array_equal(back["calibrate"], inputs["calibrate"])
            and back["prompts"] == inputs["prompts"] and back["meta"] == inputs["meta"]):
        raise SystemExit("stage_gpu.py: %s does not read back as written" % accuracy.INPUTS)

    # transformers may keep GGUF weights packed, so the proof is the model's output: the staged
    # model gives the GGUF model's logits on the staged tokens, whole and from the first part alone
    # (float32, as gpu_check.py runs), and whole in bfloat16 (as accuracy.py runs).
    ids = torch.from_numpy(tokens[:128].astype(np.int64))[None]
    bf16 = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    with torch.no_grad():
        gap_bf16 = float((load_staged(folders, dtype=torch.bfloat16)(ids).logits - bf16(ids).logits).abs().max())
    if gap_bf16 != 0:
        raise SystemExit("stage_gpu.py: in bfloat16 the staged model's logits differ from the GGUF model's by %g" % gap_bf16)
    gaps = []
    for given, layers in ((folders, model.config.num_hidden_layers), (folders[:1], args.split)):
        rebuilt = load_staged(given, dtype=torch.float32)
        if rebuilt.config.num_hidden_layers != layers:
            raise SystemExit("stage_gpu.py: %s hold %d layers, expected %d" % (given, rebuilt.config.num_hidden_layers,
                                                                              layers))
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        with torch.no_grad():
            want, got = model(ids).logits, rebuilt(ids).logits
        gaps.append(float((got - want).abs().max() / want.abs().max()))
        if gaps[-1] > 1e-5:
            raise SystemExit("stage_gpu.py: the staged model's logits differ from the GGUF model's by %g" % gaps[-1])
    for path in folders:
        size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
        print("staged %s: %.1f MB" % (path, size / 1e6))
        if size > 60e6:  # a call carries 64 MiB in all, the build's headers and wheels beside a part
            raise SystemExit("stage_gpu.py: %s is over 60 MB: move --split" % path)
    print("logits of the staged model, 30 and %d layers, within %.1e and %.1e of the GGUF model's; in bfloat16, "
          "30 layers, equal; %d tokens" % (args.split, gaps[0], gaps[1], tokens.size))
    print("%s: %d eval tokens (%d characters), %d calibration tokens, %d prompts" % (
        accuracy.INPUTS, inputs["eval"].size, inputs["meta"]["eval_chars"], inputs["calibrate"].size,
        len(inputs["prompts"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

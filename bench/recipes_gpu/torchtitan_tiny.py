"""The tiny, download-free job of the torchtitan lane (bench/recipes_gpu/lanes.py), for
torchtitan 0.2.2 (`torchrun -m torchtitan.train --job.config_file train.toml`):

    DIR/train.toml                                     the job config: llama3 "debugmodel"
                                                       (dim 256, 6 layers, 16 heads, 2048-entry
                                                       vocabulary, torchtitan's smallest; its
                                                       flex-attention variant on the GPU)
    DIR/assets/tokenizer.json, tokenizer_config.json   a byte-level BPE of <= 2048 entries,
                                                       trained here by the `tokenizers` library
                                                       (--model.hf_assets_path)
    DIR/data/train.jsonl                               {"text": ...} lines: what torchtitan's
                                                       c4_test loader reads (datasets' json
                                                       builder) through --training.dataset_path

    python -m bench.recipes_gpu.torchtitan_tiny --out DIR [--device cpu]

Paths in train.toml are relative to DIR (the job's working directory). Nothing is
downloaded; torchtitan prints its own tokens/s (`tps:`), so no tokens per step is needed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VOCAB = 2048  # llama3 debugmodel's embedding rows: every token id must stay below it
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

_SYLLABLES = ("ka", "to", "ri", "mu", "se", "no", "la", "vi", "de", "po", "an", "el", "or", "ut", "im",
              "sha", "tre", "glo", "fen", "dar", "quo", "bel", "nix", "rum", "sol")


def _words(rng: random.Random, n: int) -> list:
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def documents(count: int = 1500, seed: int = 0) -> list:
    """Text with some structure (a fixed lexicon, word bigrams), so the loss falls."""
    rng = random.Random(seed)
    lexicon = _words(rng, 600)
    follow = {w: rng.sample(lexicon, 4) for w in lexicon}
    docs = []
    for _ in range(count):
        word, out = rng.choice(lexicon), []
        for _ in range(rng.randint(80, 300)):
            out.append(word)
            word = rng.choice(follow[word]) if rng.random() < 0.8 else rng.choice(lexicon)
        docs.append(" ".join(out) + ".")
    return docs


#: (flavor, local batch, sequence length, checkpoint interval in steps) per device
SIZES = {"cuda": ("debugmodel_flex_attn", 8, 2048, 100), "cpu": ("debugmodel", 2, 256, 10)}


def toml(device: str, flavor: str | None = None) -> str:
    own, batch, seq, every = SIZES[device]
    flavor = flavor or own
    return f"""# torchtitan 0.2.2 job config of bench/recipes_gpu (torchtitan_tiny.py wrote it)
[job]
dump_folder = "outputs"
description = "gpujob recipes_gpu: tiny llama3"

[model]
name = "llama3"
flavor = "{flavor}"
hf_assets_path = "assets"

[optimizer]
name = "AdamW"
lr = 8e-4

[lr_scheduler]
warmup_steps = 2

[training]
local_batch_size = {batch}
seq_len = {seq}
steps = 1000000
dataset = "c4_test"
dataset_path = "data"

[checkpoint]
enable = true
folder = "checkpoint"
interval = {every}
last_save_model_only = false  # a resume point holds the optimizer and data loader too
keep_latest_k = 3

[activation_checkpoint]
mode = "none"

[validation]
enable = false
"""


def build(out: Path, device: str = "cuda", flavor: str | None = None) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = Path(out)
    assets, data = out / "assets", out / "data"
    assets.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    docs = documents()
    with open(data / "train.jsonl", "w") as f:
        for text in docs:
            f.write(json.dumps({"text": text}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[BOS, EOS],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    if tok.get_vocab_size() > VOCAB:
        raise SystemExit(f"torchtitan_tiny: the tokenizer has {tok.get_vocab_size()} entries, over {VOCAB}")
    tok.save(str(assets / "tokenizer.json"))
    # torchtitan's HuggingFaceTokenizer finds its BOS/EOS here and adds them itself
    (assets / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}, indent=1))
    (out / "train.toml").write_text(toml(device, flavor))
    return {"dir": str(out), "config": "train.toml", "vocab": tok.get_vocab_size(), "documents": len(docs),
            "flavor": flavor or SIZES[device][0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recipes_gpu.torchtitan_tiny",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the directory to write (the job's working directory)")
    p.add_argument("--device", choices=sorted(SIZES), default="cuda")
    p.add_argument("--flavor", default=None, help="llama3 flavor (default: per device, see SIZES)")
    args = p.parse_args(argv)
    print(json.dumps(build(Path(args.out), args.device, args.flavor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

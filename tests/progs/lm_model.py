"""A small mlx-lm model made here, with no download: `python lm_model.py DIR [--quantize]`.

A qwen2 (mlx-lm's models/qwen2.py: both tensor parallelism, `model.shard`, and pipelining,
`model.model.pipeline`) with seeded random weights, saved with mlx-lm's own save_model (the
safetensors index that pipelined loading reads), and a byte-level BPE tokenizer trained here with the
`tokenizers` package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORDS = ("the a of to and in is it that for on with as was at by an be this from or are have not "
         "one two three four five six seven eight nine ten red green blue cat dog bird fish tree "
         "house river stone cloud rain sun moon star light dark fast slow big small old new").split()


VOCAB = 320


def make(path: str, quantize: bool = False) -> Path:
    import mlx.core as mx
    from mlx_lm.models import qwen2
    from mlx_lm.utils import quantize_model, save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # Byte-level BPE, as Qwen2's: transformers rebuilds a qwen2 model's tokenizer as its
    # Qwen2Tokenizer from this file's vocabulary and merges, which then tokenizes alike.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))], trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": 512}))
    config = {
        "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB, "max_position_embeddings": 512, "tie_word_embeddings": True,
        "eos_token_id": 0,
    }
    mx.random.seed(7)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    if quantize:
        model, config = quantize_model(model, config, group_size=32, bits=4)
    save_model(out, model)
    save_config(config, out / "config.json")
    return out


if __name__ == "__main__":
    make(sys.argv[1], quantize="--quantize" in sys.argv[2:])
    print("made", sys.argv[1])

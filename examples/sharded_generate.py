"""mlx-lm's own sharded generation on fastcoll: the model split over the job's ranks by mlx-lm's
`sharded_load` (tensor parallel, or pipeline with --pipeline), generated with its
`stream_generate`. Every rank runs the same loop and says how many of the model's parameters it
holds (its shard: fewer than one process holds); rank 0 prints the text and the speeds.

    fastcoll-launch --hostfile hosts python -m fastcoll.mlx_compat examples/sharded_generate.py \\
        --model DIR --prompt "the cat" --max-tokens 32
    python examples/sharded_generate.py --model DIR       # one process, the whole model

DIR is a model folder (or a Hugging Face repo name) that mlx-lm loads; every host reads its own
copy at the same path (`python tests/progs/lm_model.py DIR` makes a small one, with random
weights, without a download). Needs mlx-lm (`pip install "mlx-lm>=0.28"`, or `pip install ".[lm]"`
in fastcoll's clone).
"""

from __future__ import annotations

import argparse

import mlx.core as mx
from mlx.utils import tree_flatten


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model folder or Hugging Face repo")
    p.add_argument("--prompt", default="the cat")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--pipeline", action="store_true", help="pipeline parallel instead of tensor parallel")
    a = p.parse_args()

    from mlx_lm import stream_generate
    from mlx_lm.utils import load, sharded_load

    group = mx.distributed.init()
    if group.size() > 1:
        pipeline, tensor = (group, None) if a.pipeline else (None, group)
        model, tokenizer = sharded_load(a.model, pipeline_group=pipeline, tensor_group=tensor)
    else:
        model, tokenizer = load(a.model)
    held = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"rank {group.rank()}: holds {held} of the model's parameters", flush=True)
    text, last = "", None
    for last in stream_generate(model, tokenizer, a.prompt, max_tokens=a.max_tokens):
        text += last.text
    if group.rank() == 0 and last is not None:
        split = "pipeline" if a.pipeline else "tensor parallel"
        print(f"{group.size()} rank(s), {split if group.size() > 1 else 'one process'}: {a.prompt!r} -> {text!r}")
        print(f"prompt {last.prompt_tokens} tokens, {last.prompt_tps:.1f} tokens/s; generated "
              f"{last.generation_tokens} tokens, {last.generation_tps:.1f} tokens/s")


if __name__ == "__main__":
    main()

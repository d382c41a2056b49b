"""Offline batched inference with deepinfer (vLLM-style API).

    ./build.sh && python3 examples/offline_inference.py [--model DIR] [--max-tokens N]

Without --model it uses DEEPINFER_HF_MODEL_DIR, else the bundled default model
(assets/default-model): a small DeepSeek-V4 trained on public-domain English (Bible, fortunes,
dictionaries, software manuals), so expect English of that flavour, not facts.
"""
import argparse

from deepinfer import LLM, SamplingParams

PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "In the beginning",
    "A computer program is",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args()

    llm = LLM(model=args.model)
    print(llm.describe())
    params = SamplingParams(temperature=args.temperature, top_p=0.95, max_tokens=args.max_tokens, seed=0)
    outputs = llm.generate(PROMPTS, params)
    for out in outputs:
        if out.error:
            print(f"Prompt: {out.prompt!r} rejected: {out.error}")
            continue
        print(f"Prompt: {out.prompt!r}\nGenerated: {out.outputs[0].text!r}\n")
    print(llm.last_summary())


if __name__ == "__main__":
    main()

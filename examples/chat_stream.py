"""Interactive streaming chat in Python (what `deepinfer chat` does in C++).

    ./build.sh && python3 examples/chat_stream.py [--model DIR] [--max-tokens N]

Type a message, get the reply printed piece by piece as the engine decodes it; an empty
line or EOF quits. The conversation so far is sent with every turn.
"""
import argparse
import sys

from deepinfer import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--system", default="")
    args = ap.parse_args()

    llm = LLM(model=args.model)
    params = SamplingParams(temperature=args.temperature, top_p=0.95, max_tokens=args.max_tokens)
    conv = [{"role": "system", "content": args.system}] if args.system else []
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        conv.append({"role": "user", "content": line})
        reply = ""
        for out in llm.chat(conv, params, stream=True):  # delta outputs, stop strings held back
            piece = out.outputs[0].text if out.outputs else ""
            reply += piece
            sys.stdout.write(piece)
            sys.stdout.flush()
        print()
        conv.append({"role": "assistant", "content": reply})


if __name__ == "__main__":
    main()

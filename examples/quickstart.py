"""Generate with the built-in model through langrt.Engine.

    .venv/bin/python examples/quickstart.py
"""

import time

import langrt


def main() -> None:
    engine = langrt.Engine()  # SmolLM2-135M-Instruct, bundled as a GGUF file
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = engine.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    out = engine.generate(prompt, {"max_new_tokens": 32, "temperature": 0})
    print(f"Q: {chat[0]['content']}\nA: {out['text']}")

    questions = ["Name a primary colour.", "What is 2 + 2?", "Say hello in French.", "What do bees make?"]
    prompts = [
        engine.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]
    start = time.perf_counter()
    outs = engine.generate(prompts, {"max_new_tokens": 32, "temperature": 0})
    elapsed = time.perf_counter() - start
    for q, o in zip(questions, outs):
        print(f"Q: {q}\nA: {o['text']}")
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(f"batch of {len(prompts)}: {tokens} tokens in {elapsed:.2f} s ({tokens / elapsed:.1f} tok/s)")


if __name__ == "__main__":
    main()

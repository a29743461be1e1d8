"""Train the demo's byte-level BPE tokenizer and write it in Hugging Face form."""

from __future__ import annotations

import json
from pathlib import Path

from winport.demo.corpus import demo_corpus

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SPECIAL_TOKENS = [BOS, EOS, PAD, USER, ASSISTANT]  # ids 0..4: BOS=0 and EOS=1 as DeepSeek's

# DeepSeek's chat format, reduced to what the demo needs: system text, user and assistant turns.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)

# The vision demo's template: the same prompt for string content; a list of parts (OpenAI
# multimodal content, which SGLang hands a template that loops over the content as
# {"type": "image"} / {"type": "text", "text": ...}) gets DeepSeek's image placeholder where each
# image goes (SGLang's V4.1 image processor expands it into the image's token span). A template that
# only prints message['content'] makes SGLang drop the images (its "string" content format).
IMAGE_CHAT_TEMPLATE = (
    "{% macro render(content) %}{% if content is string %}{{ content }}{% else %}"
    "{% for part in content %}{% if part['type'] == 'image' %}{{ '<｜deepseek_image｜>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endmacro %}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ render(message['content']) }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + render(message['content']) }}"
    "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + render(message['content']) + eos_token }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


def train_tokenizer(vocab_size: int) -> object:
    """Train a byte-level BPE on the demo corpus (deterministic for a given vocab size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(demo_corpus(), trainer=trainer)
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int, extra_special: list[str] | None = None,
                    chat_template: str = CHAT_TEMPLATE) -> int:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return the vocab size.

    ``extra_special``: special tokens added after training, at ids vocab_size, vocab_size + 1, ...
    (the trained vocabulary is the same with or without them).
    """
    tok = train_tokenizer(vocab_size)
    if extra_special:
        from tokenizers import AddedToken

        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in extra_special])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 8192,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, ensure_ascii=False) + "\n"
    )
    return tok.get_vocab_size()

"""The checkpoint's tokenizer and chat template (loaded from local files only; nothing is downloaded)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from alpamayo.errors import CheckpointError


@functools.cache
def qwen3vl_chat_template() -> str:
    """Qwen3-VL's chat template for text and image items, bundled: the demo checkpoint's, and the driving
    prompt's fallback for a checkpoint whose tokenizer has none."""
    return (Path(__file__).resolve().parent / "assets" / "qwen3vl_chat_template.jinja").read_text()


def load_tokenizer(directory: str | Path) -> Any:
    """`transformers` fast tokenizer of a checkpoint directory (tokenizer.json + chat template)."""
    from transformers import AutoTokenizer, PretrainedConfig

    directory = Path(directory)
    if not (directory / "tokenizer.json").is_file() and not (directory / "vocab.json").is_file():
        raise CheckpointError(f"{directory}: no tokenizer.json (or vocab.json) in checkpoint directory")
    try:
        # An empty config keeps AutoTokenizer from reading config.json: it cannot parse the Alpamayo layout and
        # warned on every load; the tokenizer class comes from tokenizer_config.json.
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, config=PretrainedConfig())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: cannot load tokenizer ({e})") from e


def chat_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    fallback_template: str | None = None,
) -> list[int]:
    """Render `messages` with the checkpoint's chat template (`fallback_template` where the tokenizer has
    none) and tokenize the result (specials included)."""
    template = getattr(tokenizer, "chat_template", None) or fallback_template
    if not template:
        raise CheckpointError(f"{tokenizer.name_or_path}: the tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]

"""The checkpoint's tokenizer and chat template (loaded from local files only; nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alpamayo.errors import CheckpointError


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
) -> list[int]:
    """Render `messages` with the checkpoint's chat template and tokenize the result (specials included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise CheckpointError(f"{tokenizer.name_or_path}: the tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]

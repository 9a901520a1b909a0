"""Text to token ids and back in the daemon, from a model directory's tokenizer.json (Rust `tokenizers`, no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from agent.artifacts import ArtifactError
from agent.artifacts.config import read_config


class NoTokenizer(ValueError):
    """The model directory has no usable tokenizer.json; the client can still send token ids."""


# A text longer than its model's positions could hold at this many times its longest token's length is refused
# (or, for a truncating model, cut) before it is tokenized: normalizers may shorten a text (BERT's drops control
# characters), so the bound keeps a margin.
TEXT_SLACK = 2


class TextCodec:
    """One model's tokenizer, and the longest sequence its positions allow (None: no known limit)."""

    def __init__(self, tokenizer: Tokenizer, max_positions: int | None, truncate: bool) -> None:
        self.max_positions = max_positions
        self._tokenizer = tokenizer
        # A token stands for at most this many characters (byte-level vocabularies spell a byte as a character).
        longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=1)
        # The most characters a prompt this model can take may hold (None: no known limit).
        self.max_chars = TEXT_SLACK * max_positions * max(longest, 1) if max_positions else None
        # tokenizer.json may carry its own padding and truncation (all-MiniLM-L6-v2 pads every text to
        # 128 ids): padding is the batcher's business, the length limit the model's positions.
        tokenizer.no_padding()
        if truncate and max_positions:
            # The tokenizer truncates before adding [CLS]/[SEP], so the special tokens survive.
            tokenizer.enable_truncation(max_positions)
        else:
            tokenizer.no_truncation()

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with the model's special tokens (BOS, or [CLS] ... [SEP])."""
        return [encoding.ids for encoding in self._tokenizer.encode_batch(list(texts))]

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of a fragment, without special tokens (for stop sequences)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token as text on its own (for log probabilities), special tokens included."""
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def token_piece(self, token_id: int) -> str | None:
        """One token as its vocabulary spells it ("Ġthe", "▁the", "<0xE2>"); None for an id outside it."""
        return self._tokenizer.id_to_token(token_id)


class Tokenizers:
    """Each model directory's codec, loaded once (per truncation setting)."""

    def __init__(self) -> None:
        self._codecs: dict[tuple[str, bool], TextCodec] = {}
        self._positions: dict[str, int | None] = {}

    def cached(self, model_path: str, truncate: bool) -> TextCodec | None:
        """The codec of `model_path` when it has been read already."""
        return self._codecs.get((model_path, truncate))

    def get(self, model_path: str, *, truncate: bool) -> TextCodec:
        """The codec of `model_path`; NoTokenizer naming the file when there is none."""
        key = (model_path, truncate)
        if key not in self._codecs:
            self._codecs[key] = _load(Path(model_path), self.max_positions(model_path), truncate)
        return self._codecs[key]

    def max_positions(self, model_path: str) -> int | None:
        """The longest sequence the model's config.json allows (None when it names no limit)."""
        if model_path not in self._positions:
            self._positions[model_path] = _max_positions(Path(model_path))
        return self._positions[model_path]


def _load(path: Path, max_positions: int | None, truncate: bool) -> TextCodec:
    file = path / "tokenizer.json"
    if not file.is_file():
        raise NoTokenizer(f"{file} does not exist: this model takes token ids only")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust side raises plain Exception on a malformed file
        raise NoTokenizer(f"{file} cannot be read ({e}): this model takes token ids only") from e
    return TextCodec(tokenizer, max_positions, truncate)


def _max_positions(path: Path) -> int | None:
    try:
        return read_config(path / "config.json").positions()
    except ArtifactError:
        return None

"""Tokenizer built from a GGUF file's vocabulary, merges and chat template.

Byte-level BPE (``tokenizer.ggml.model == "gpt2"``) only, built on the ``tokenizers`` library:
the GGUF stores tokens in GPT-2's byte-to-unicode form, so a ``models.BPE`` over them with a
ByteLevel pre-tokenizer and decoder reproduces the original tokenizer. What GGUF does not store
is the pre-tokenizer regex: ``tokenizer.ggml.pre`` only names it, so the regexes per name live
here (same split rules as llama.cpp and the models' own tokenizer.json files).

Control (3) and user-defined (4) tokens become added tokens: matched atomically in the input
text, never split by BPE. Chat templates are rendered with jinja2 in a sandbox.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from engine.errors import EngineError, UnsupportedError

log = logging.getLogger(__name__)

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3  # <|im_start|>, <|endoftext|>: special, dropped by decode(skip_special=True)
TOKEN_USER_DEFINED = 4  # <tool_call>: added text, matched whole but decoded like text

# Qwen2's tokenizer.json regex; llama-3's differs only in grouping digits by up to three.
_QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_RE = _QWEN2_RE.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

_PRE_QWEN2 = {"qwen2", "stablelm2", "deepseek-r1-qwen", "hunyuan", "megrez"}
_PRE_LLAMA3 = {"llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe", "chatglm-bpe"}
# Llama-3 style vocabularies match whole words against the vocab before merging, and add BOS.
_PRE_IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe"}
# GPT-2 regex after splitting every digit on its own (the starcoder / SmolLM family).
_PRE_DIGITS_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}
_PRE_GPT2 = {"gpt2", "gpt-2", "default", "mpt", "olmo", "jais", "trillion", "granite-docling"}

# End-of-generation markers besides tokenizer.ggml.eos_token_id, when the vocab has them.
_EOG_TEXTS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in _PRE_QWEN2 or pre in _PRE_LLAMA3:
        regex = _QWEN2_RE if pre in _PRE_QWEN2 else _LLAMA3_RE
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence([split, byte_level])
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _PRE_DIGITS_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    if pre not in _PRE_GPT2:
        log.warning("unknown tokenizer.ggml.pre %r: using the GPT-2 pre-tokenizer regex", pre)
    return gpt2


def _as_int(v: Any) -> int | None:
    return None if v is None else int(v)


class Tokenizer:
    """Encode, decode and chat-template rendering for one model's vocabulary."""

    def __init__(
        self,
        hf: _HFTokenizer,
        *,
        tokens: Sequence[str],
        bos_id: int | None,
        eos_id: int | None,
        eos_ids: frozenset[int],
        add_bos: bool,
        special_ids: frozenset[int],
        chat_template: str | None,
        pre: str,
    ) -> None:
        self._hf = hf
        self._tokens = tokens
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids = eos_ids
        self.add_bos = add_bos
        self.special_ids = special_ids
        self.chat_template = chat_template
        self.pre = pre
        self._template: Any = None

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata decoded to Python values (``tokenizer.ggml.*`` keys)."""
        kind = md.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise UnsupportedError(
                f"tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
                "sentencepiece ('llama') and others are not implemented"
            )
        pre = str(md.get("tokenizer.ggml.pre", "default"))
        tokens = list(md["tokenizer.ggml.tokens"])
        n = len(tokens)
        # dict(zip) and a comprehension keep a 151k vocabulary well under a second to build.
        vocab = dict(zip(tokens, range(n), strict=True))
        if len(vocab) != n:
            log.warning("GGUF vocabulary has %d duplicate token strings", n - len(vocab))
        merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", ())]

        hf = _HFTokenizer(
            models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _PRE_IGNORE_MERGES)
        )
        hf.pre_tokenizer = _pre_tokenizer(pre)
        hf.decoder = decoders.ByteLevel()

        types = np.asarray(md.get("tokenizer.ggml.token_type", np.ones(n)), dtype=np.int64)
        control = np.flatnonzero(types == TOKEN_CONTROL).tolist()
        user = np.flatnonzero(types == TOKEN_USER_DEFINED).tolist()
        # Their text is already in the vocab, so the library reuses the GGUF ids for them.
        hf.add_special_tokens(
            [AddedToken(tokens[i], special=True, normalized=False) for i in control]
        )
        hf.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])

        bos_id = _as_int(md.get("tokenizer.ggml.bos_token_id"))
        eos_id = _as_int(md.get("tokenizer.ggml.eos_token_id"))
        eog = {eos_id} if eos_id is not None else set()
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if md.get(key) is not None:
                eog.add(int(md[key]))
        special = set(control) | set(user)
        for text in _EOG_TEXTS:
            tid = vocab.get(text)
            if tid is not None and tid in special:
                eog.add(tid)

        add_bos = md.get("tokenizer.ggml.add_bos_token")
        if add_bos is None:
            add_bos = pre in _PRE_IGNORE_MERGES  # llama-3 style vocabularies start with BOS
        return cls(
            hf,
            tokens=tokens,
            bos_id=bos_id,
            eos_id=eos_id,
            eos_ids=frozenset(eog),
            add_bos=bool(add_bos) and bos_id is not None,
            special_ids=frozenset(special),
            chat_template=md.get("tokenizer.chat_template"),
            pre=pre,
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; special tokens written in the text become their single id."""
        ids = self._hf.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids``; control tokens are kept unless ``skip_special``."""
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, text: str) -> int | None:
        return self._hf.token_to_id(text)

    def id_to_token(self, token_id: int) -> str:
        """The token's string as stored in the GGUF (byte-level form for normal tokens)."""
        return self._tokens[token_id]

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Render ``messages`` with the model's chat template (``extra``: e.g. ``tools``)."""
        from jinja2.exceptions import SecurityError, TemplateError

        bos = self._tokens[self.bos_id] if self.bos_id is not None else ""
        eos = self._tokens[self.eos_id] if self.eos_id is not None else ""
        try:
            if self._template is None:
                if not self.chat_template:
                    raise UnsupportedError("this model's GGUF has no tokenizer.chat_template")
                self._template = _chat_env().from_string(self.chat_template)
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos,
                eos_token=eos,
                **extra,
            )
        except _TemplateRaised as e:
            raise EngineError(f"the chat template rejected the messages: {e}") from e
        except SecurityError as e:  # the GGUF's template tried to reach outside its sandbox
            raise EngineError(f"the model's chat template does what the sandbox blocks: {e}") from e
        except TemplateError as e:
            raise EngineError(f"the model's chat template cannot be rendered: {e}") from e


class _TemplateRaised(Exception):
    """raise_exception() called from inside a chat template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    # Like HF's: templates embed tool schemas and expect non-ASCII kept as is.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _chat_env() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Same settings as transformers' apply_chat_template, so templates render identically.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env

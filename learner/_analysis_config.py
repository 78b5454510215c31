"""Which tool names mean what, and what counts as an error or a read-back: the rules behind the behaviour rubrics.

Defaults cover the reference ``react`` harness (``bash``, ``read_file``, ``write_file``), Codex CLI (``shell``,
``exec_command``, ``apply_patch``), Claude Code (``Bash``, ``Read``, ``Write``, ``Edit``, ``MultiEdit``, ``Grep``,
``Glob``) and mini-swe-agent (``bash``). A tool in no category is *service-specific* (an MCP server's or a task's own
API). Override any field from a TOML file::

    pass_threshold = 1.0
    error_patterns = ['Traceback \\(most recent call last\\)', 'exit code [1-9]']

    [categories]
    shell = ["bash", "shell", "exec_command", "Bash"]
    search = ["Grep", "Glob", "search_code"]

A key that is not a field of :class:`RubricConfig` is an error, not ignored.
"""

from __future__ import annotations

import re
import tomllib
from re import _constants as _C
from re import _parser
from dataclasses import dataclass, field, fields
from pathlib import Path

SHELL, READ, WRITE, SEARCH, SERVICE = "shell", "read", "write", "search", "service"
CATEGORIES = (SHELL, READ, WRITE, SEARCH, SERVICE)

_DEFAULT_CATEGORIES = {
    SHELL: ("bash", "shell", "exec_command", "Bash", "run_command", "terminal"),
    READ: ("read_file", "Read", "view", "cat_file", "NotebookRead"),
    WRITE: ("write_file", "apply_patch", "Write", "Edit", "MultiEdit", "edit_file", "create_file", "NotebookEdit",
            "str_replace_editor"),
    SEARCH: ("Grep", "Glob", "grep", "glob", "search", "find_files", "list_files", "LS"),
}

# A tool result "signals an error" when it matches any of these (Python regexes, searched, case-sensitive).
_DEFAULT_ERRORS = (
    r"Traceback \(most recent call last\)",
    r"(?i)\b(exit[ _]?code|exit status|returncode|return code)\b\W{0,3}[1-9]\d*",
    r"(?m)^(Error|ERROR|error)\b",
    r"\b[A-Z][A-Za-z]*(Error|Exception): ",
    r"command not found",
    r"No such file or directory",
    r"Permission denied",
)

# Shell commands that read a path back (checked with the path on the same command line).
_DEFAULT_READBACK = (r"\b(cat|head|tail|less|more|ls|stat|test|wc|diff|grep|nl|sed -n|file|md5sum|sha256sum)\b",)
# Shell commands that run tests: they verify everything written before them.
_DEFAULT_TEST_RUNS = (r"\bpytest\b", r"python\d?(\.\d+)? -m (pytest|unittest)", r"\b(npm|yarn|pnpm) (run )?test\b",
                      r"\bgo test\b", r"\bcargo test\b", r"\bmake (test|check)\b", r"\btox\b")
# Shell commands that write a path: redirections, tee, in-place edits, touch/cp/mv targets.
_DEFAULT_SHELL_WRITES = (r"(?<![<>&\d])>{1,2}\s*(?P<path>[^\s;|&<>]+)", r"\btee\s+(?:-a\s+)?(?P<path>[^\s;|&<>]+)",
                         r"\bsed\s+-i\S*\s+(?:'[^']*'|\"[^\"]*\"|\S+)\s+(?P<path>[^\s;|&<>]+)",
                         r"\btouch\s+(?P<path>[^\s;|&<>]+)")

# Shell commands that change something the write patterns above do not name as a path: moves, copies, removals, new
# folders, links, modes, package installs, git's writes. A call with one of these (or a write) is not an inspection.
_DEFAULT_SHELL_CHANGES = (r"\b(mv|cp|rm|rmdir|mkdir|ln|chmod|chown|truncate|install|patch|dd)\s",
                          r"\bgit\s+(add|commit|checkout|switch|reset|restore|apply|stash|rm|mv|merge|rebase|push)\b",
                          r"\b(pip3?|npm|yarn|pnpm|apt|apt-get|uv)\s+(install|uninstall|remove|add|sync)\b")
_DEFAULT_PATH_KEYS = ("path", "file_path", "filepath", "filename", "file", "notebook_path", "target_file")
_DEFAULT_COMMAND_KEYS = ("command", "cmd", "script", "input")
# tool-call markup of common chat templates: Hermes / Qwen / SmolLM2, Llama 3's python tag, Llama 3.x / Functionary
_DEFAULT_UNPARSED_MARKERS = ("<tool_call>", "<|python_tag|>", "<function=")
# A file name with an extension (its last path component), ASCII only: what "Made-up names" looks for in tool-call
# arguments and in everything the rollout was shown (learner._rubrics.names_in).
_DEFAULT_NAME_PATTERNS = (r"(?<![A-Za-z0-9_.-])[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*\.[A-Za-z][A-Za-z0-9]{0,5}"
                          r"(?![A-Za-z0-9_-])",)


def _required(items, fold: bool) -> frozenset[str] | None:
    """Strings one of which every match of this parsed regex sequence contains (None: nothing known). Only what is
    certain counts: literal runs, branches whose every alternative has some, groups and repeats of at least one;
    classes, anchors and lookarounds contribute nothing. Without ``fold`` a case-insensitive group contributes
    nothing either; with it (a pattern that ignores case) literals count lowercased, as :func:`_fold` compares."""
    best: frozenset[str] | None = None
    run: list[str] = []

    def consider(found: frozenset[str] | None) -> None:
        nonlocal best
        if found and (best is None or min(map(len, found)) > min(map(len, best))):
            best = found

    for op, av in items:
        if op is _C.LITERAL:
            run.append(chr(av).lower() if fold else chr(av))
            continue
        consider(frozenset(["".join(run)]) if run else None)
        run = []
        if op is _C.SUBPATTERN:
            if fold or not av[1] & re.IGNORECASE:
                consider(_required(av[3].data, fold))
        elif op is _C.ATOMIC_GROUP:
            consider(_required(av.data, fold))
        elif op is _C.BRANCH:
            alts = [_required(alt.data, fold) for alt in av[1]]
            if all(alts):
                consider(frozenset().union(*alts))
        elif op in (_C.MAX_REPEAT, _C.MIN_REPEAT, _C.POSSESSIVE_REPEAT) and av[0] >= 1:
            consider(_required(av[2].data, fold))
    consider(frozenset(["".join(run)]) if run else None)
    return best


def _prefilter(pattern: str) -> tuple[frozenset[str], bool] | None:
    """(literals one of which every match contains, whether they are to be looked for in :func:`_fold` of the
    text) for a pattern, or None. A pattern that ignores case gets its literals only when they are all ASCII."""
    try:
        parsed = _parser.parse(pattern)
    except re.error:
        return None
    fold = bool(parsed.state.flags & re.IGNORECASE)
    found = _required(parsed.data, fold)
    if found is None or (fold and not all(lit.isascii() for lit in found)):
        return None
    return found, fold


# sre matches a case-insensitive ASCII letter c where the simple lowercase of the text's character is c, or is one
# of c's extra cases (re._casefix: dotless i, long s). str.lower is that simple mapping for every character but
# U+0130 (whose full lowercase is two characters), so this folding puts c wherever sre would match it.
_FOLD = {0x130: "i", 0x131: "i", 0x17F: "s"}


def _fold(text: str) -> str:
    return text.lower() if text.isascii() else text.translate(_FOLD).lower()


_PATTERN_FIELDS = ("error_patterns", "readback_patterns", "test_run_patterns", "shell_write_patterns",
                   "shell_change_patterns", "name_patterns")


class RubricConfigError(ValueError):
    """A rubric configuration (TOML or dataclass) that cannot be used."""


@dataclass(frozen=True)
class RubricConfig:
    """Every rule the rubrics apply; :mod:`learner._rubrics` documents how each is used."""

    categories: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(_DEFAULT_CATEGORIES))
    error_patterns: tuple[str, ...] = _DEFAULT_ERRORS
    readback_patterns: tuple[str, ...] = _DEFAULT_READBACK
    test_run_patterns: tuple[str, ...] = _DEFAULT_TEST_RUNS
    shell_write_patterns: tuple[str, ...] = _DEFAULT_SHELL_WRITES
    shell_change_patterns: tuple[str, ...] = _DEFAULT_SHELL_CHANGES
    path_keys: tuple[str, ...] = _DEFAULT_PATH_KEYS
    command_keys: tuple[str, ...] = _DEFAULT_COMMAND_KEYS
    # An answer without tool calls whose text holds one of these opened a call the server's parser could not read
    # (learner._answers).
    unparsed_markers: tuple[str, ...] = _DEFAULT_UNPARSED_MARKERS
    # File names: a name a tool call's arguments hold that nothing the rollout was shown holds is made up.
    name_patterns: tuple[str, ...] = _DEFAULT_NAME_PATTERNS
    # A rollout passes (for pass@k / pass^k) when its latest reward is >= this; without a reward, when its
    # outcome is "success".
    pass_threshold: float = 1.0
    # Outcomes that count as graded attempts for pass@k; infra errors and cancelled runs never do (invariant 6).
    graded_outcomes: tuple[str, ...] = ("success", "failure", "policy_timeout", "harness_error")

    def __post_init__(self) -> None:
        unknown = set(self.categories) - set(CATEGORIES) - {SERVICE}
        if unknown:
            raise RubricConfigError(
                f"tool categories {sorted(unknown)} unknown: use {', '.join(c for c in CATEGORIES if c != SERVICE)} "
                "(any tool in none of them is service-specific)")
        seen: dict[str, str] = {}
        for cat, names in self.categories.items():
            for name in names:
                if name in seen and seen[name] != cat:
                    raise RubricConfigError(f"tool {name!r} is in categories {seen[name]!r} and {cat!r}: "
                                            "a tool has one category; remove it from one list")
                seen[name] = cat
        for attr in _PATTERN_FIELDS:
            for pat in getattr(self, attr):
                try:
                    re.compile(pat)
                except re.error as exc:
                    raise RubricConfigError(f"{attr}: {pat!r} is not a valid regex ({exc}); fix or remove it") from None
        object.__setattr__(self, "_by_name", seen)
        object.__setattr__(self, "_compiled", {a: tuple(re.compile(p) for p in getattr(self, a))
                                               for a in _PATTERN_FIELDS})

    def category(self, tool_name: str | None) -> str:
        """The category of a tool by exact name; tools in no list are service-specific."""
        return self._by_name.get(tool_name or "", SERVICE)

    def category_map(self) -> dict[str, str]:
        """Tool name -> category for every listed tool (for SQL joins, e.g. in DuckDB notebooks)."""
        return dict(self._by_name)

    def patterns(self, attr: str) -> tuple[re.Pattern, ...]:
        return self._compiled[attr]

    def matches_any(self, attr: str, text: str) -> bool:
        """Whether any of the ``attr`` patterns is found in ``text``. A pattern runs only where ``text`` holds one
        of the literals every match of it contains (``"Permission denied"``; ``"exit"`` or ``"return"``, in any case):
        a substring test is a fraction of a regex search, and over a million tool results most patterns never
        need to run. (One union regex of all seven was slower than each in turn: sre finds no prefix to skip by.)"""
        checks = self.__dict__.get("_checks")
        if checks is None:
            checks = self.__dict__.setdefault("_checks", {})
        if attr not in checks:
            checks[attr] = tuple((p, *(_prefilter(p.pattern) or (None, False))) for p in self._compiled[attr])
        folded = None
        for pat, literals, fold in checks[attr]:
            if literals is not None:
                if fold and folded is None:
                    folded = _fold(text)
                hay = folded if fold else text
                for lit in literals:
                    if lit in hay:
                        break
                else:
                    continue
            if pat.search(text):
                return True
        return False

    @classmethod
    def from_toml(cls, path: str | Path) -> RubricConfig:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise RubricConfigError(f"rubric config {path}: no such file; pass an existing TOML file") from None
        except tomllib.TOMLDecodeError as exc:
            raise RubricConfigError(f"rubric config {path}: not valid TOML ({exc})") from None
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "rubric config") -> RubricConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise RubricConfigError(f"{where}: keys {sorted(unknown)} unknown; known keys are {', '.join(sorted(known))}")
        kw = {}
        for k, v in data.items():
            if k == "categories":
                given = {cat: tuple(names) for cat, names in v.items()}
                moved = {n for names in given.values() for n in names}  # a listed tool leaves its default list
                merged = {cat: tuple(n for n in names if n not in moved) for cat, names in _DEFAULT_CATEGORIES.items()}
                kw[k] = {**merged, **given}
            elif isinstance(v, list):
                kw[k] = tuple(v)
            else:
                kw[k] = v
        return cls(**kw)

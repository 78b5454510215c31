"""How a phase's result leaves its container without an exec stream: the phase wrapper and its message.

Every phase container runs ``/bin/sh -c PHASE_SCRIPT openforge-phase ARGV...``. The wrapper copies the phase's
files from the per-rollout Secret into place, runs ARGV (under ``timeout`` when the image has it), and then
writes one JSON object to the container's termination message (``/dev/termination-log``)::

    {"v": 1, "exit": 0, "timed_out": 0, "outputs": {"/logs/verifier/reward.json": "<base64>"}}

and exits 0, so a failing harness (an init container) does not fail the pod and the verifier still runs. The
kubelet keeps at most 4096 bytes of a termination message (less when a pod has more than three containers: 12 KiB
in all). When the message would be longer, the wrapper writes ``"overflow": 1`` there instead and prints the full
object on stdout between ``OVERFLOW_BEGIN`` / ``OVERFLOW_END``; the backend then reads it back from the container's
log (one extra GET through the API server, still no exec). Service phases (native sidecars) only copy files and
``exec`` ARGV.

The verifier's container sets one more: ``OPENFORGE_CLEAN_ENV`` (newline-separated names) runs ARGV under
``env -i`` with only those variables. An overflowed result is read back from the last line of the log only: whatever
ARGV printed comes before it, however long. An output that is a symlink is not read (as if it did not exist).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field

FORMAT_VERSION = 1
OVERFLOW_BEGIN = "@@openforge-result-begin@@"
OVERFLOW_END = "@@openforge-result-end@@"
FILES_DIR = "/openforge/files"
MESSAGE_MAX = 4096
POD_MESSAGE_MAX = 12 * 1024

PHASE_SCRIPT = r"""set -u
tab=$(printf '\t')
fdir=${OPENFORGE_FILES_DIR:-/openforge/files}
if [ -n "${OPENFORGE_FILES:-}" ]; then
  printf '%s\n' "$OPENFORGE_FILES" | while IFS="$tab" read -r key mode path; do
    [ -n "$key" ] || continue
    mkdir -p "$(dirname "$path")" && cp "$fdir/$key" "$path" && chmod "$mode" "$path" || {
      echo "openforge: cannot write $path (is its folder writable?)" >&2; exit 1; }
  done || exit 1
fi
[ "${OPENFORGE_MODE:-phase}" = service ] && exec "$@"
if [ -n "${OPENFORGE_CLEAN_ENV:-}" ]; then
  n=$#
  set -f
  for name in $OPENFORGE_CLEAN_ENV; do
    case $name in ''|[0-9]*|*[!A-Za-z0-9_]*) echo "openforge: bad variable name '$name'" >&2; exit 1 ;; esac
    eval "set -- \"\$@\" \"$name=\${$name-}\""
  done
  set +f
  while [ "$n" -gt 0 ]; do set -- "$@" "$1"; shift; n=$((n - 1)); done
  set -- env -i "$@"
fi
t0=$(date +%s)
limit=${OPENFORGE_TIMEOUT_S:-0}
if [ "$limit" -gt 0 ] && command -v timeout >/dev/null 2>&1; then
  timeout -k 5 "$limit" "$@"
else
  "$@"
fi
rc=$?
elapsed=$(( $(date +%s) - t0 ))
to=0
if [ "$limit" -gt 0 ] && [ "$rc" -ne 0 ] && [ "$elapsed" -ge "$limit" ]; then to=1; fi
msg=${OPENFORGE_SCRATCH:-/tmp}/openforge-result.$$
rm -f "$msg"
{
  printf '{"v":1,"exit":%d,"timed_out":%d,"outputs":{' "$rc" "$to"
  sep=
  printf '%s\n' "${OPENFORGE_OUTPUTS:-}" | while IFS= read -r p; do
    [ -n "$p" ] && [ -f "$p" ] && [ ! -L "$p" ] || continue
    printf '%s"%s":"' "$sep" "$p"
    base64 < "$p" | tr -d '\n'
    printf '"'
    sep=,
  done
  printf '}}'
} > "$msg"
log=${OPENFORGE_TERMINATION_LOG:-/dev/termination-log}
max=${OPENFORGE_MESSAGE_MAX:-4096}
if [ "$(wc -c < "$msg")" -le "$max" ]; then
  cat "$msg" > "$log"
else
  printf '{"v":1,"exit":%d,"timed_out":%d,"overflow":1}' "$rc" "$to" > "$log"
  printf '\n%s' "@@openforge-result-begin@@"
  cat "$msg"
  printf '%s\n' "@@openforge-result-end@@"
fi
rm -f "$msg"
exit 0
"""


class ResultError(ValueError):
    """A termination message or log that does not hold a phase result."""


@dataclass
class WrappedResult:
    exit_code: int
    timed_out: bool
    overflow: bool
    outputs: dict[str, bytes] = field(default_factory=dict)


def message(exit_code: int, outputs: dict[str, bytes] | None = None, *, timed_out: bool = False) -> str:
    """The termination message the wrapper writes (used by the emulator's fake kubelet too)."""
    enc = {p: base64.b64encode(b).decode() for p, b in (outputs or {}).items()}
    return json.dumps({"v": FORMAT_VERSION, "exit": exit_code, "timed_out": int(timed_out), "outputs": enc},
                      separators=(",", ":"))


def parse_message(text: str) -> WrappedResult:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultError(f"termination message {text[:200]!r} is not JSON ({exc}); the container did not run "
                          f"the openforge phase wrapper to its end (killed, or its image lacks /bin/sh)") from None
    if not isinstance(obj, dict) or obj.get("v") != FORMAT_VERSION or not isinstance(obj.get("exit"), int):
        raise ResultError(f"termination message {text[:200]!r} is not a version-{FORMAT_VERSION} phase result")
    try:
        outputs = {p: base64.b64decode(b, validate=True) for p, b in (obj.get("outputs") or {}).items()}
    except (binascii.Error, TypeError) as exc:
        raise ResultError(f"termination message carries an output that is not base64 ({exc})") from None
    return WrappedResult(obj["exit"], bool(obj.get("timed_out")), bool(obj.get("overflow")), outputs)


def split_log(log: str) -> tuple[str, WrappedResult | None]:
    """A container log -> (the phase's own output, the overflowed result if the wrapper printed one)."""
    start = log.rfind(OVERFLOW_BEGIN)
    if start < 0:
        return log, None
    end = log.find(OVERFLOW_END, start)
    if end < 0:
        raise ResultError("the container log holds the start of an overflowed result but not its end; the log "
                          "was cut (raise phase_log_bytes) or the container was killed while printing it")
    body = log[start + len(OVERFLOW_BEGIN):end]
    own = log[:start].removesuffix("\n") + log[end + len(OVERFLOW_END):].removeprefix("\n")
    return own, parse_message(body)


def message_limit(n_containers: int) -> int:
    """Bytes of termination message the kubelet keeps per container in a pod of ``n_containers``."""
    return min(MESSAGE_MAX, POD_MESSAGE_MAX // max(1, n_containers))

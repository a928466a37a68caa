"""Per-queue submit tokens (`pool serve --queue-tokens FILE`, mode 600): a token lets its holder
submit, list, look into, scale and cancel the jobs of one queue, and nothing else; the pool's
admin secret does everything.

The file holds one `QUEUE TOKEN` per line (`#` starts a comment). Each queue must be one the
pool has, each token at least 16 characters and used once.
"""

from __future__ import annotations

import hmac

from ringmaster.common.errors import UsageError

MIN_TOKEN_CHARS = 16
MAX_TOKENS = 1000


def parse_queue_tokens(text: str, queues: set[str], where: str = "--queue-tokens") -> dict[str, str]:
    """token -> queue, or UsageError naming the line that is wrong."""
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise UsageError(f"{where} line {number}: write QUEUE TOKEN (two words)")
        queue, token = parts
        if queue not in queues:
            raise UsageError(f"{where} line {number}: unknown queue {queue[:80]!r}; this pool has "
                             f"{', '.join(sorted(queues))} (--queue-weights names the queues)")
        if len(token) < MIN_TOKEN_CHARS:
            raise UsageError(
                f"{where} line {number}: the token of {queue} is shorter than {MIN_TOKEN_CHARS} characters"
            )
        if token in tokens:
            raise UsageError(f"{where} line {number}: a token is given twice")
        tokens[token] = queue
        if len(tokens) > MAX_TOKENS:
            raise UsageError(f"{where}: more than {MAX_TOKENS} tokens")
    return tokens


def queue_of(token: str, tokens: dict[str, str]) -> str | None:
    """The queue a presented token is for (compared in constant time against each), or None."""
    found = None
    for known, queue in tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            found = queue
    return found

"""`python -m alpamayo.tt.dryrun COMMAND [ARG...]`: run a command under a fresh ttnn dry run (what
`scripts/ttnn-dryrun` does), e.g. `alpamayo generate --backend ttnn ...`.

`python -m alpamayo.tt.dryrun --env DIR` instead builds the dry run in DIR (kept) and prints its variables
as shell `export` lines, for a shell session: `eval "$(python -m alpamayo.tt.dryrun --env /tmp/dry)"`.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from alpamayo.errors import BackendUnavailable
from alpamayo.tt.dryrun import prepare, run

USAGE = "usage: ttnn-dryrun COMMAND [ARG...] | ttnn-dryrun --env DIR"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}", file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    try:
        if argv[0] == "--env":
            if len(argv) != 2:
                print(USAGE, file=sys.stderr)
                return 2
            for name, value in prepare(Path(argv[1])).items():
                print(f"export {name}={shlex.quote(value)}")
            return 0
        status = run(argv)
        return 128 - status if status < 0 else status  # killed by signal N: 128 + N, as a shell reports it
    except (BackendUnavailable, FileExistsError) as e:
        print(f"ttnn-dryrun: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"ttnn-dryrun: error: cannot run {argv[0]!r}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

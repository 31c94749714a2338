# SPDX-License-Identifier: Apache-2.0
"""What the io tests' Python checks share: the closing lines and the command line."""
import sys


def finish(script, failures, passed):
    """Prints the closing line and returns the exit status: 1 when anything failed."""
    if failures:
        print(f"{script}: {failures} failure(s)")
        return 1
    print(f"{script}: {passed}")
    return 0


def cli(main, doc, nargs):
    """Runs main with the nargs command-line arguments, or exits with the usage in doc."""
    if len(sys.argv) != nargs + 1:
        sys.exit(doc)
    sys.exit(main(*sys.argv[1:]))

# SPDX-License-Identifier: Apache-2.0
"""The ``attnkit`` command line."""

import sys


def main(argv=None) -> int:
    print("attnkit: command line not implemented yet", file=sys.stderr)
    return 2

# SPDX-License-Identifier: Apache-2.0
"""`python -m attnkit`: the `attnkit` command (attnkit.cli)."""

import sys

from .cli import main

sys.exit(main())

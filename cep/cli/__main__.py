"""`python -m cep.cli ...`, as the `cep` console script."""

from __future__ import annotations

import sys

from cep.cli import main

sys.exit(main())

"""``python -m ledger.audit``: the auditor's command line (``ledger.audit.cli``)."""

import sys

from ledger.audit.cli import main

if __name__ == "__main__":
    sys.exit(main())

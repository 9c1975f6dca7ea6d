"""The append-only ledger: entries hashed and chained, written only by ``ledger.services``."""

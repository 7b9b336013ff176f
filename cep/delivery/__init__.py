"""Output records and the sinks that deliver them effectively once (see docs/delivery.md)."""

from cep.delivery.record import OutRecord

__all__ = ["OutRecord"]

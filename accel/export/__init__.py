"""Write, verify and load optimized checkpoints."""

from accel.export.checkpoint import MANIFEST_NAME, VerifyResult, verify_export, write_export

__all__ = ["MANIFEST_NAME", "VerifyResult", "verify_export", "write_export"]

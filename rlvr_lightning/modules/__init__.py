from rlvr_lightning.modules.rlvr import RLVRModule

__all__ = ["RLVRModule"]

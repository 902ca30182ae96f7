from rlvr_lightning.data.datamodule import RLVRDataModule
from rlvr_lightning.data.sort_task import SortTask
from rlvr_lightning.data.task import Task, collate_examples

__all__ = ["RLVRDataModule", "SortTask", "Task", "collate_examples"]

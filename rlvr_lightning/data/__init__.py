# Every task and data module is imported here, so the CLI's help lists them (`rlvr fit --data.help RLVRDataModule`
# shows jsonargparse's "known subclasses" of Task: those imported when the parser is built).
from rlvr_lightning.data.arithmetic import ArithmeticTask
from rlvr_lightning.data.datamodule import RLVRDataModule
from rlvr_lightning.data.difficulty_filter import DifficultyFilter
from rlvr_lightning.data.hf_datasets import HFDatasetTask
from rlvr_lightning.data.inline_task import InlineTask
from rlvr_lightning.data.jsonl_task import JSONLTask
from rlvr_lightning.data.reasoning_gym_task import ReasoningGymTask
from rlvr_lightning.data.sft_data import SFTDataModule
from rlvr_lightning.data.sort_task import SortTask
from rlvr_lightning.data.task import Task, collate_examples
from rlvr_lightning.data.verifiers_task import VerifiersTask

__all__ = [
    "DifficultyFilter",
    "ArithmeticTask",
    "HFDatasetTask",
    "InlineTask",
    "JSONLTask",
    "RLVRDataModule",
    "ReasoningGymTask",
    "SFTDataModule",
    "SortTask",
    "Task",
    "VerifiersTask",
    "collate_examples",
]

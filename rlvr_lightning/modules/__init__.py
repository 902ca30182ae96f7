from rlvr_lightning.modules.expert_iteration import ExpertIterationModule
from rlvr_lightning.modules.policy_checkpoint import policy_from_checkpoint
from rlvr_lightning.modules.policy_module import PolicyModule
from rlvr_lightning.modules.ppo import PPOModule
from rlvr_lightning.modules.rlvr import RLVRModule
from rlvr_lightning.modules.self_distillation import SelfTeacher
from rlvr_lightning.modules.sft import SFTModule

__all__ = [
    "ExpertIterationModule",
    "PPOModule",
    "PolicyModule",
    "RLVRModule",
    "SFTModule",
    "SelfTeacher",
    "policy_from_checkpoint",
]

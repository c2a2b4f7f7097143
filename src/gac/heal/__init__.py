"""heal: recover a compressed model by distillation from its original; dims and parameter count unchanged."""

from gac.heal.distill import DistillConfig, DistillResult, distill
from gac.heal.run import HealConfig, HealOutput, heal_dir, heal_model

__all__ = ["DistillConfig", "DistillResult", "HealConfig", "HealOutput", "distill", "heal_dir", "heal_model"]

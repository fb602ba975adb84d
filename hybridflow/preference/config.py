"""The ``preference:`` section's settings (``PreferenceConfig``), defined beside the learner step
that reads them (``hybridflow.services.learner.preference_config``) and re-exported here for the
offline preference job and its users."""

from hybridflow.services.learner.preference_config import (
    DPO_LOSS_TYPES,
    PAIR_LOSSES,
    PREFERENCE_LOSSES,
    DPOLossType,
    PreferenceConfig,
)

__all__ = ["DPO_LOSS_TYPES", "PAIR_LOSSES", "PREFERENCE_LOSSES", "DPOLossType", "PreferenceConfig"]

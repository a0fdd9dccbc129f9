"""Kale: forecast-driven worker allocation, as two registered policies that share their first stages (``base``).

* ``kale`` (``receding``, the default): the offline optimum's program solved from now over the forecast;
* ``kale_stabilizer`` (``stabilizer``): the paper's estimator and stabilizer, then a restart-cost test (``choice``).
"""

from kale_dagster.policies.kale.base import KaleSettings
from kale_dagster.policies.kale.receding import KaleConfig, KalePolicy
from kale_dagster.policies.kale.stabilizer import KaleStabilizerConfig, KaleStabilizerPolicy

__all__ = ["KaleConfig", "KalePolicy", "KaleSettings", "KaleStabilizerConfig", "KaleStabilizerPolicy"]

"""Search for the best subnet under latency / size budgets.

Strategies (``ask``/``tell``, one file each): :class:`Evolution` (tournament selection,
HAT / Evolved Transformer, optional aging), :class:`RandomSearch`, :class:`NSGA2`.
:func:`run_search` is the one loop; it keeps every evaluation in an Optuna storage
(:mod:`.storage`), so a search resumes after a kill and several workers cooperate.
Fitness (:mod:`.fitness`) and constraints (:mod:`.constraints`) are passed in.
:func:`run_hurdles` (:mod:`.hurdles`) then trains the top candidates in rounds (progressive dynamic
hurdles), in the same storage.
"""

from .budget import budget_plans, format_ms, parse_budget, parse_budgets, parse_count, parse_workload_budgets, plan_label
from .cache import BatchCache, CachedFitness, CachedLatency
from .constraints import AnalyticLatency, Constraints, LatencyBudget, ParamLimit, feasible_seeds, param_counter
from .driver import BudgetSearch, Progress, SearchResult, best_per_budget, run_search, strategy_rng
from .evolution import Evolution
from .fitness import FitnessSettings, InheritedLoss, inherited_fitness, pick_device, task_fitness
from .hurdles import (
    TRAIN_BATCH,
    CandidateTrainer,
    HurdleConfig,
    HurdleOutcome,
    SubnetTrainer,
    hurdle_candidates,
    hurdle_config,
    replay,
    run_hurdles,
)
from .nsga2 import NSGA2
from .operators import crossover, draw, mutate
from .pareto import hypervolume, non_dominated_sort, pareto_front
from .random_search import RandomSearch
from .storage import (Record, TrialStore, check_storage, config_hash, default_storage, heartbeat_interval, open_storage,
                      open_study)
from .strategy import STRATEGIES, SearchConfig, Strategy, register_strategy

__all__ = [
    "NSGA2",
    "STRATEGIES",
    "register_strategy",
    "TRAIN_BATCH",
    "AnalyticLatency",
    "BatchCache",
    "BudgetSearch",
    "CachedFitness",
    "CachedLatency",
    "CandidateTrainer",
    "Constraints",
    "Evolution",
    "HurdleConfig",
    "HurdleOutcome",
    "FitnessSettings",
    "InheritedLoss",
    "inherited_fitness",
    "task_fitness",
    "LatencyBudget",
    "ParamLimit",
    "Progress",
    "RandomSearch",
    "Record",
    "SearchConfig",
    "SearchResult",
    "Strategy",
    "SubnetTrainer",
    "TrialStore",
    "best_per_budget",
    "budget_plans",
    "config_hash",
    "crossover",
    "default_storage",
    "heartbeat_interval",
    "draw",
    "feasible_seeds",
    "format_ms",
    "hurdle_candidates",
    "hurdle_config",
    "hypervolume",
    "mutate",
    "non_dominated_sort",
    "open_storage",
    "check_storage",
    "open_study",
    "param_counter",
    "parse_budget",
    "parse_budgets",
    "parse_count",
    "parse_workload_budgets",
    "plan_label",
    "replay",
    "run_hurdles",
    "pareto_front",
    "pick_device",
    "run_search",
    "strategy_rng",
]

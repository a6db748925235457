"""Algorithms, which know nothing of specific envs, and fixed policies to play against (the random
policy; a scripted connect four player, which reads that game's observation). The runner meets
them all through ``Agent``."""
from marlkit.agents.base import ActOut, Agent, Progress, Schedule
from marlkit.agents.coma import COMA
from marlkit.agents.connect_four_rules import ConnectFourRules
from marlkit.agents.ddpg import IDDPG, MADDPG, MATD3
from marlkit.agents.ippo import IPPO
from marlkit.agents.iql import IQL
from marlkit.agents.mappo import MAPPO
from marlkit.agents.mat import MAT
from marlkit.agents.off_policy import OffPolicyAgent, OffPolicyConfig
from marlkit.agents.off_policy_actor_critic import ActorCriticConfig, OffPolicyActorCritic
from marlkit.agents.on_policy import OnPolicyAgent, OnPolicyConfig
from marlkit.agents.poca import POCA
from marlkit.agents.qmix import QMIX
from marlkit.agents.random_policy import RandomAgent
from marlkit.agents.sac import ISAC, MASAC
from marlkit.agents.value_decomposition import ValueDecompositionAgent, ValueDecompositionConfig
from marlkit.agents.vdn import VDN

__all__ = ["ActOut", "ActorCriticConfig", "Agent", "Progress", "Schedule", "COMA", "ConnectFourRules", "IDDPG", "IPPO", "IQL", "ISAC",
           "MADDPG", "MAPPO", "MASAC", "MAT", "MATD3", "OffPolicyActorCritic", "OffPolicyAgent", "OffPolicyConfig",
           "OnPolicyAgent", "OnPolicyConfig", "POCA", "QMIX", "RandomAgent", "VDN", "ValueDecompositionAgent",
           "ValueDecompositionConfig"]

"""Where collected steps go: the layout storage is made for, the rollout ``[T, E, A, ...]`` every
collect fills, and the storage of each algorithm family (a rollout to learn from once, or a replay
of whole episodes or of transitions), with the returns computed over them."""
from marlkit.storage.base import Collected, ReplayBatch, Storage
from marlkit.storage.layout import Bootstrap, StorageLayout, Transition
from marlkit.storage.on_policy import RolloutBatch, RolloutStorage, gather, minibatches
from marlkit.storage.replay import EpisodeReplay
from marlkit.storage.rollout import Rollout
from marlkit.storage.transitions import TransitionReplay

__all__ = ["Bootstrap", "Collected", "EpisodeReplay", "ReplayBatch", "Rollout", "RolloutBatch", "RolloutStorage",
           "Storage", "StorageLayout", "Transition", "TransitionReplay", "gather", "minibatches"]

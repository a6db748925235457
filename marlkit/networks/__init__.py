"""Networks: registered encoders (``mlp``, ``cnn``, ``gru``, ``mixed``) and masked action distributions."""
from marlkit.networks.base import Encoder
from marlkit.networks.cnn import CNN
from marlkit.networks.distributions import ActionHead, Categorical, DiagGaussian, MultiCategorical
from marlkit.networks.mixed import Mixed
from marlkit.networks.mlp import MLP
from marlkit.networks.rnn import GRU

__all__ = ["Encoder", "CNN", "MLP", "Mixed", "GRU", "ActionHead", "Categorical", "DiagGaussian", "MultiCategorical"]

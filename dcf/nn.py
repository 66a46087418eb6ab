"""Neural-network helpers: the nn.* ops, RNN cells, dynamic_rnn/static_rnn, dense."""

from __future__ import annotations

from dcf.ops.nn_ops import (  # noqa: F401
    log_softmax, relu, sigmoid, softmax, softmax_cross_entropy_with_logits,
    sparse_softmax_cross_entropy_with_logits, tanh,
)

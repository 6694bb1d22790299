"""The causal LM's learner: next-byte prediction, every position scored (:class:`supernet.task.NextToken`)."""

from supernet.task import NextToken

CAUSAL_LM = NextToken()

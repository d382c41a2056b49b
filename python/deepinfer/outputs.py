"""vLLM-shaped outputs: RequestOutput, CompletionOutput, Logprob, RequestMetrics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# One position: token id -> Logprob (the chosen token first, then the top-N).
PositionLogprobs = Dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[PositionLogprobs]]
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" | None while running
    stop_reason: Union[int, str, None] = None  # stop string or stop token id (None for EOS)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: Optional[float]
    first_token_time: Optional[float]
    last_token_time: Optional[float]
    finished_time: Optional[float]
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    # Speculative decoding (zeros without drafts), over all n samples: steps that verified
    # drafts, drafts verified and accepted, and per draft position how often it was verified and
    # accepted.
    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    draft_verified_per_position: List[int] = field(default_factory=list)
    draft_accepted_per_position: List[int] = field(default_factory=list)

    @property
    def time_to_first_token(self) -> Optional[float]:
        return None if not self.first_token_time else self.first_token_time - self.arrival_time

    @property
    def acceptance_length(self) -> Optional[float]:
        """Mean tokens committed per verify step (1 + accepted drafts / verify steps); None without drafts."""
        return None if not self.num_verify_steps else 1.0 + self.num_accepted_draft_tokens / self.num_verify_steps

    @property
    def acceptance_rate_per_position(self) -> List[float]:
        """For each draft position, the share of its verifications that accepted it."""
        return [a / v if v else 0.0 for a, v in zip(self.draft_accepted_per_position, self.draft_verified_per_position)]


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[List[Optional[PositionLogprobs]]]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Optional[RequestMetrics] = None
    error: Optional[str] = None  # set when the request was rejected; outputs is then empty
    num_cached_tokens: int = 0   # prompt tokens served by prefix caching (vLLM's name)

    def __repr__(self) -> str:
        if self.error:
            return f"RequestOutput(request_id={self.request_id!r}, error={self.error!r})"
        return (f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
                f"outputs={self.outputs!r}, finished={self.finished})")


def _position(lp) -> PositionLogprobs:
    return {int(t): Logprob(l.logprob, l.rank, l.decoded_token) for t, l in lp}


def _stop_reason(c, stop_token_ids) -> Union[int, str, None]:
    # vLLM: the stop string, or the stop token id when one of stop_token_ids ended it; None for EOS.
    if c.stop_string is not None:
        return c.stop_string
    if c.stop_token_id is not None and c.stop_token_id in stop_token_ids:
        return int(c.stop_token_id)
    return None


def from_cpp(r, stop_token_ids=()) -> RequestOutput:
    """Converts a _C.engine.RequestOutput."""
    outs = []
    for c in r.outputs:
        outs.append(CompletionOutput(
            index=c.index, text=c.text, token_ids=list(c.token_ids),
            cumulative_logprob=c.cumulative_logprob,
            logprobs=None if c.logprobs is None else [_position(p) for p in c.logprobs],
            finish_reason=c.finish_reason or None,
            stop_reason=_stop_reason(c, set(stop_token_ids))))
    m = r.metrics
    metrics = RequestMetrics(m.arrival_time, m.first_scheduled_time or None, m.first_token_time or None,
                             m.last_token_time or None, m.finished_time or None, m.num_generation_tokens,
                             m.num_preemptions, m.num_verify_steps, m.num_draft_tokens, m.num_accepted_draft_tokens,
                             list(m.draft_verified_per_position), list(m.draft_accepted_per_position))
    plp = None if r.prompt_logprobs is None else [None if p is None else _position(p) for p in r.prompt_logprobs]
    return RequestOutput(r.request_id, r.prompt or None, list(r.prompt_token_ids), plp, outs, r.finished, metrics,
                         r.error or None, int(r.num_cached_tokens))

"""A minimal client of the Prometheus HTTP API (instant queries), every call with a timeout.

Errors are `PrometheusError` with a message for a person: unreachable (connection refused, DNS, timeout), an HTTP
error, or an answer that is not the API's.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Literal

from pydantic import BaseModel, ValidationError

DEFAULT_TIMEOUT = 30.0


class PrometheusError(Exception):
    """Prometheus could not answer a query."""


class Sample(BaseModel):
    metric: dict[str, str]
    value: tuple[float, str]  # (Unix time, value as text: Prometheus writes NaN and +Inf that way)

    @property
    def number(self) -> float:
        return float(self.value[1])


class _VectorData(BaseModel):
    resultType: Literal["vector"]
    result: list[Sample]


class _Answer(BaseModel):
    status: Literal["success", "error"]
    data: _VectorData | None = None
    errorType: str = ""
    error: str = ""


class Prometheus:
    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """An instant query that must answer a vector."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        request = urllib.request.Request(
            f"{self.url}/api/v1/query",
            data=urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as e:  # 400/422/503 still carry the API's JSON error
            body = e.read()
            if not body:
                raise PrometheusError(f"Prometheus at {self.url} answered HTTP {e.code} {e.reason}") from e
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise PrometheusError(f"Prometheus at {self.url} is unreachable: {reason}") from e
        try:
            answer = _Answer.model_validate(json.loads(body))
        except (ValueError, ValidationError) as e:
            raise PrometheusError(f"{self.url} did not answer as the Prometheus HTTP API does: {e}") from e
        if answer.status == "error" or answer.data is None:
            raise PrometheusError(f"Prometheus at {self.url} refused the query: {answer.errorType}: {answer.error}")
        return answer.data.result

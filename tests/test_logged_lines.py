"""harness/cell/main.py `logged_lines`: the messages vLLM logs while an engine starts, read where log records are
made, without breaking a record factory that vLLM wraps meanwhile (vLLM 0.32+ adds `vllm_process_name` that way,
at its first engine start in a process; on vLLM 0.33.0 on the H200 every later message of a warm worker failed to
format with `KeyError: 'vllm_process_name'` once the factory found before that start was put back)."""

from __future__ import annotations

import logging

from kvmatrix.harness.cell.main import logged_lines


def wrap_factory_as_vllm_does() -> None:
    inner = logging.getLogRecordFactory()

    def adding_process_name(*args, **kwargs):
        record = inner(*args, **kwargs)
        record.vllm_process_name = "EngineCore"
        return record

    logging.setLogRecordFactory(adding_process_name)


def test_a_factory_wrapped_inside_survives_and_our_reader_stops():
    before = logging.getLogRecordFactory()
    try:
        log = logging.getLogger("vllm.test_logged_lines")
        with logged_lines("vllm", [r"replaced"]) as notes:
            log.warning("backend FLASHINFER replaced by TRITON_ATTN")
            wrap_factory_as_vllm_does()  # the engine start configures vLLM's logging
            log.warning("backend replaced again")
        log.warning("backend replaced after the cell")
        assert notes == ["backend FLASHINFER replaced by TRITON_ATTN", "backend replaced again"]
        record = logging.getLogRecordFactory()("vllm.x", logging.INFO, __file__, 1, "m", (), None)
        assert record.vllm_process_name == "EngineCore"
    finally:
        logging.setLogRecordFactory(before)


def test_the_factory_found_is_put_back_where_nothing_wrapped_it():
    before = logging.getLogRecordFactory()
    with logged_lines("vllm", [r"x"]):
        assert logging.getLogRecordFactory() is not before
    assert logging.getLogRecordFactory() is before

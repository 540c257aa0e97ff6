# lightning_per — every target sets itself up (creates .venv and installs what it needs).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/dqn_cartpole.yaml
ARGS ?=
OLDEST_TESTS ?= tests/replay tests/checkpoints tests/graphs/test_graphs_capture.py
# pytest-xdist workers of the CPU test targets (a file's tests stay on one worker: module fixtures are built once).
# Many tests wait on processes they start: on two cores two workers take `make test` from 1,009 s to 745 s.
# JOBS=0 runs the tests in one process.
JOBS ?= 2
XDIST := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)

.PHONY: train test test-oldest test-newest test-gpu bench lint clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, so that a torch wheel found locally (pip's --find-links / PIP_FIND_LINKS) is the one used.
	$(BIN)/python -m pip install -q "torch>=2.11"
	$(BIN)/python -m pip install -q -e ".[test,dev]"
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/lightning-per fit --config $(CONFIG) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) $(ARGS)

# The replay, checkpoint and capture tests again under the oldest torchrl / tensordict that pyproject.toml accepts,
# installed beside the venv's (TorchRL's C++ tree, an oracle of some tests, may not load against this torch: those
# tests then skip).
OLDEST := $(VENV)/oldest
$(OLDEST)/.installed: $(STAMP)
	rm -rf $(OLDEST)
	$(BIN)/python -m pip install -q --no-deps --target $(OLDEST) "torchrl==0.11.1" "tensordict==0.11.0"
	touch $@

test-oldest: $(OLDEST)/.installed
	PYTHONPATH=$(OLDEST) $(BIN)/python -m pytest -q $(XDIST) $(ARGS) $(OLDEST_TESTS)

# The kernel, replay, capture and config tests under the newest torch, Triton and tensordict the package index serves,
# in a venv of their own (.venv-newest; the main venv keeps what pyproject.toml resolves to). PIP_CONSTRAINT=/dev/null
# overrides any constraint file the environment sets (pins for the main venv), in this target only; tensordict is
# upgraded last, past torchrl's pin of it (pip warns of the conflict and installs it: that is the point).
NEWEST := .venv-newest
NEWEST_TESTS ?= tests/kernels tests/replay tests/graphs tests/ga3c/test_ga3c_config.py tests/cli/test_cli_dqn.py
# The multi-process writer and collector tests run whole under `make test`; here one each of the shared-memory
# writers, the Gloo writers and TorchRL's collectors (their children's imports were about half of this target's time).
W := tests/replay/test_replay_writers.py
R := tests/replay/test_replay_remote_ingress.py
NEWEST_DESELECT ?= \
	--deselect "$(W)::test_kill_9_of_a_writer_leaves_nothing_torn_and_the_others_go_on" \
	--deselect "$(W)::test_four_writers_every_transition_exactly_once[rank]" \
	--deselect "$(W)::test_four_writers_every_transition_exactly_once[uniform]" \
	--deselect "$(W)::test_frame_buffer_takes_writer_handles_made_after_its_first_write" \
	--deselect "$(W)::test_a_captured_sample_and_update_run_1000_steps_without_a_sync_while_two_writers_ingest" \
	--deselect "$(W)::test_generations_of_writer_rows_across_overwrite_restore_and_reset" \
	--deselect "$(W)::test_frame_buffer_ingests_a_drain_larger_than_one_extend" \
	--deselect "$(R)::test_the_owners_death_ends_the_writers_with_a_clear_error_within_10_s" \
	--deselect "$(R)::test_a_writers_death_is_a_connection_error_in_the_owner_and_the_other_goes_on" \
	--deselect "$(R)::test_a_remote_ingest_whose_extend_fails_keeps_the_batches_queued" \
	--deselect "tests/replay/test_replay_collectors.py::test_multiasync_collector_fills_our_buffer_like_torchrls"
$(NEWEST)/.installed: pyproject.toml
	test -x $(NEWEST)/bin/python || $(PY) -m venv $(NEWEST)
	PIP_CONSTRAINT=/dev/null $(NEWEST)/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT=/dev/null $(NEWEST)/bin/python -m pip install -q --upgrade torch triton
	PIP_CONSTRAINT=/dev/null $(NEWEST)/bin/python -m pip install -q --upgrade -e ".[test]"
	PIP_CONSTRAINT=/dev/null $(NEWEST)/bin/python -m pip install -q --upgrade tensordict
	$(NEWEST)/bin/python -c "import torch, triton, tensordict, torchrl; print('newest:', torch.__version__, \
		'triton', triton.__version__, 'tensordict', tensordict.__version__, 'torchrl', torchrl.__version__)"
	touch $@

test-newest: $(NEWEST)/.installed
	$(NEWEST)/bin/python -m pytest -q $(XDIST) $(ARGS) $(NEWEST_TESTS) $(NEWEST_DESELECT)

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks run replay --quick --out runs/bench $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check lightning_per ext tests benchmarks examples
	$(BIN)/lint-imports  # the layering contracts of pyproject.toml ([tool.importlinter])

clean-venv:
	rm -rf $(VENV) $(NEWEST)

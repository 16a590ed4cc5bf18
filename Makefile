# Both targets build their own virtual environment; nothing needs installing by hand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The whole story on the embedded default (digits, digits-cnn), on the target hardware's own terms: plan the best
# schedule whose LATENCY on Bit Fusion is at most 65% of static 8-bit training's (Bit Fusion's array packs 4 3-4-bit
# products per row where 5-8-bit ones take one, so the pick must spend time below 5 bits; priced on its array,
# buffers and tiling, digits-cnn at static 4 bits takes 57% of static 8's latency, at static 2 48%), train exactly
# that plan, then report the executed latency and energy saving on Bit Fusion -- and, for contrast, on an H100, whose
# int8 tier runs every width up to 8 bits at one rate (no saving there), and on Stripes, a bit-serial array whose
# compute time falls per bit.
DEMO_HW := bitfusion
demo: $(STAMP)
	rm -rf runs/demo
	mkdir -p runs/demo
	@echo "== 1/3 plan: the best schedule within 65% of static 8-bit's latency on $(DEMO_HW)"
	$(VENV)/bin/cptsim plan --budget 65% --metric latency --hw $(DEMO_HW) --out runs/demo/plan.json --plot runs/demo/plan.png
	@echo "== 2/3 train exactly that plan (real quantized training, one trace line per step)"
	$(VENV)/bin/cptsim train --plan runs/demo/plan.json --out runs/demo/run
	@echo "== 3/3 report: planned vs executed, and the saving (E/t) realised on each hardware"
	$(VENV)/bin/cptsim report runs/demo/run --hw $(DEMO_HW),stripes,h100

# Two workers (pytest-xdist): the suite is CPU-bound and mostly one thread per test, so on the 2-core machines CI
# runs on it takes ~2/3 of the serial time (6:40 against 7:55-10:11 measured on one); each worker builds its own
# session fixtures and kernel cache (tests/conftest.py gives each its own CPTSIM_HOME and results database).
test: $(STAMP)
	$(PY) -m pytest -q -n 2

bench: $(STAMP)
	$(PY) benchmarks/bench_quant_step.py

clean:
	rm -rf $(VENV) runs build *.egg-info

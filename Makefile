# gpuready.nvidia — build and test. `make test` is THE test command (also run by .ci/run).
#
#   make test         bootstrap build sanity lint units go-build integration docs (stops at the first failure)
#   make <stage>      one stage (plus bootstrap and build, which are cheap when already done)
#   make clean        remove .build and .cache/dist;  make distclean: also .venv*, .cache
#   make soak         the property tests of the containerd config engine with 1,500 examples each (~10 min)
#   make bench        bench/: our figures as ratios against baselines measured in the same run (bench/README.md)
#   make demo         the README's main command: the lab (reused if up), then playbooks/site.yml against it
#   make lab-up / lab-down / lab-env   the podman GPU-node lab by hand (lab/README.md); `make test` starts its own
#                                      (make lab-up LAB_NODES=gpu-p4,gpu-p4-v3: other nodes)
#
#   make go-build     the lab's real components from their Go modules (lab/go), into .cache/bin
#
# Each stage prints "==> stage NAME: Ns". Caches kept between runs: .venv, .venv-latest,
# .cache/ (containerd .debs, pip wheel, tomlkit-oldest, Go binaries per pinned version),
# ~/.ansible/test (sanity venvs) and Go's module and build caches.

SHELL := /bin/bash
.NOTPARALLEL:
.DEFAULT_GOAL := test

# Oldest tomlkit the containerd config engine supports; keep equal to requirements.txt.
TOMLKIT_OLDEST ?= 0.15.1

STAGE := tools/stage.sh

.PHONY: test bootstrap build sanity lint units units-main units-tomlkit-oldest go-build integration docs clean distclean
.PHONY: lab-up lab-down lab-env demo bench soak

test: bootstrap build sanity lint units go-build integration docs

bootstrap:
	@$(STAGE) bootstrap tools/bootstrap.sh

build: bootstrap
	@$(STAGE) build tools/build.sh

sanity: build
	@$(STAGE) sanity tools/sanity.sh

lint: build
	@$(STAGE) lint tools/lint.sh

units: units-main units-tomlkit-oldest

units-main: build
	@$(STAGE) units tools/pytest.sh units

units-tomlkit-oldest: build
	@$(STAGE) units-tomlkit-$(TOMLKIT_OLDEST) tools/pytest.sh tomlkit-oldest $(TOMLKIT_OLDEST)

go-build: bootstrap
	@$(STAGE) go-build tools/go-build.sh

integration: build go-build
	@$(STAGE) integration tools/pytest.sh integration

docs: build
	@$(STAGE) docs tools/docs.sh

soak: build
	@$(STAGE) soak tools/pytest.sh soak

# Benchmarks, about 20 minutes on 2 cores: bench/results/<name>.json and SUMMARY.md (BENCH_ARGS=--smoke, or names)
bench: build
	@$(STAGE) bench tools/bench.sh $(BENCH_ARGS)

# The whole fix on the lab: site.yml against it (lab up first, or reused), ending with the validation table
demo: build go-build
	@tools/demo.sh $(DEMO_ARGS)

# The lab (lab/lab.py): `eval "$$(make -s lab-env)"` exports KUBECONFIG, GPUREADY_LAB_INVENTORY, ...
lab-up: bootstrap go-build
	@.venv/bin/python lab/lab.py up $(if $(LAB_NODES),--nodes $(LAB_NODES))

lab-down:
	@.venv/bin/python lab/lab.py down

lab-env:
	@.venv/bin/python lab/lab.py env

clean:
	rm -rf .build .cache/dist tests/output

distclean: clean
	rm -rf .venv .venv-latest .cache

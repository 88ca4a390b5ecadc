# Pagewise: `make eval` runs every experiment in quick mode; `make test` runs the whole suite.
# Both install what a fresh machine of this kind lacks first.

SHELL := /bin/bash
CARGO ?= cargo
PAGEWISE := target/release/pagewise
EVAL_FLAGS ?= --quick

.PHONY: all build eval report test deps fmt lint clean install uninstall test-install ycsb java java-test

all: build

# Debian packages the tests and experiments use, installed only when missing.
APT_PACKAGES := build-essential pkg-config iproute2
# hps-kvcache's peers (memcached) and memcslap
APT_PACKAGES += memcached libmemcached-tools
# the Java module (java/) and the YCSB binding (bench/ycsb)
APT_PACKAGES += openjdk-17-jdk-headless maven
# third-party programs of dlm-programs, hps-programs and the compatibility tests (compat_*.rs)
APT_PACKAGES += hpcc 7zip xz-utils zstd python3-numpy redis-server sqlite3 perl
# `pagewise mpi` (built against PMIx, tested under mpirun) and the testbed's links (iproute2)
APT_PACKAGES += openmpi-bin libopenmpi-dev libpmix-dev
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }

build: deps
	$(CARGO) build --release --workspace
	$(MAKE) java

# hps-kvcache drives the caches with YCSB too (bench/ycsb), so eval builds the binding.
eval: build ycsb
	$(PAGEWISE) eval all $(EVAL_FLAGS)

# docs/FIGURES.md and results/report.html (plots inline), rendered from results/*/result.json
# (`make eval` writes quick results to results/NAME/; full runs go to results/NAME-full/), and
# from docs/results/ for what this machine has not run; what was shown is kept there.
report: build
	$(PAGEWISE) eval report --figures docs/FIGURES.md --html

# Every test binary runs (--no-fail-fast), then the install test (dist/test-install.sh, counted
# as one test). A test that finds a kernel feature missing calls
# pagewise_kernel::testing::skip, which appends "BINARY::TEST: REASON" to $(SKIP_LOG); those
# tests are listed with their reasons and counted as skipped, out of cargo's "passed". The
# closing line is "N passed, N failed, N skipped", printed also when tests fail; the exit
# status is cargo's.
SKIP_LOG := $(CURDIR)/target/skips.log
test: build
	@mkdir -p target && : > $(SKIP_LOG)
	@set -o pipefail; PAGEWISE_SKIP_LOG=$(SKIP_LOG) $(CARGO) test --release --workspace --no-fail-fast 2>&1 \
		| tee target/test.log; status=$$?; \
	PAGEWISE_SKIP_LOG=$(SKIP_LOG) dist/test-install.sh 2>&1 | tee target/test-install.log; install_status=$$?; \
	if [ $$install_status -eq 0 ]; then r="ok. 1 passed; 0 failed"; else r="FAILED. 0 passed; 1 failed"; status=1; fi; \
	echo "test result: $$r; 0 ignored; 0 measured; 0 filtered out (dist/test-install.sh)" >> target/test.log; \
	(cd java && $(MVN) test) 2>&1 | sed -u 's/\x1b\[[0-9;]*m//g' | tee target/test-java.log; java_status=$$?; \
	[ $$java_status -eq 0 ] || status=1; \
	awk -v st="$$java_status" '/^\[[A-Z]+\] Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+$$/ { gsub(/,/, ""); t = $$4; f = $$6 + $$8; k = $$10 } \
		END { if (t == "" && st != 0) { t = 1; f = 1; k = 0 } \
		      printf "test result: java. %d passed; %d failed; %d ignored; 0 measured; 0 filtered out (java/, Maven Surefire)\n", t - f - k, f, k }' \
		target/test-java.log >> target/test.log; \
	grep -h "^skipped: " target/test-java.log | sed 's/^skipped: /java::/' >> $(SKIP_LOG) || true; \
	skipped=$$(wc -l < $(SKIP_LOG)); \
	if [ "$$skipped" -gt 0 ]; then echo "skipped tests:"; sed 's/^/  /' $(SKIP_LOG); fi; \
	echo; awk -v s="$$skipped" -v status="$$status" '/^test result:/ { p += $$4; f += $$6 } \
		END { printf "%d passed, %d failed, %d skipped", p - s, f, s; \
		      if (status != 0 && f == 0) printf " (cargo test exited with status %d: a test binary did not build or crashed, see above)", status; \
		      printf "\n" }' target/test.log; \
	exit $$status

# make install [PREFIX=/usr/local] [DESTDIR=...]: the binary, libpagewise.so/.a, headers,
# pkg-config file, reclaimd systemd unit + example config, man pages, shell completions
# (dist/install.sh; BINDIR, LIBDIR, INCLUDEDIR, DATADIR, MANDIR, SYSCONFDIR and SYSTEMDUNITDIR
# override the layout). make uninstall removes exactly what install recorded in its manifest.
PREFIX ?= /usr/local
export PREFIX DESTDIR BINDIR LIBDIR INCLUDEDIR DATADIR MANDIR SYSCONFDIR SYSTEMDUNITDIR
install: build
	dist/install.sh install

uninstall:
	dist/install.sh uninstall

# Install into a temporary prefix, build and run C programs through pkg-config, uninstall,
# and check that nothing is left (also run by `make test`).
test-install: build
	dist/test-install.sh

# The YCSB binding (bench/ycsb): Maven fetches YCSB core and spymemcached from Maven Central.
ycsb:
	@command -v mvn >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven openjdk-17-jdk-headless; }
	cd bench/ycsb && $(MVN) -q package

# The Java module (java/): JNI binding to hp_alloc, HugepageBuffers, the Spark agent and plugin.
# Packs target/release/libpagewise.so into java/target/pagewise-spark-0.1.0.jar.
MVN ?= mvn -B -Dstyle.color=never
java:
	cd java && $(MVN) -q package -DskipTests

java-test:
	cd java && $(MVN) test

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean

# Entry points; each is a thin wrapper around a script under tests/.
.PHONY: demo test bench up down status build-control-plane

demo: ## Start the control plane, the provisioning controller and the simulator; narrate two Jobs
	bash tests/demo.sh

test: ## fmt, clippy, docs, unit tests and the end-to-end suite against a real Kueue
	bash tests/run-all.sh

bench: ## Measure an SDK check's answer latency and throughput on the local control plane (ARGS=...)
	bash tests/bench.sh $(ARGS)

up: ## Start the local control plane (etcd, kube-apiserver, Kueue)
	bash tests/control-plane/control-plane.sh start

down: ## Stop the local control plane
	bash tests/control-plane/control-plane.sh stop

status: ## Show what runs
	bash tests/control-plane/control-plane.sh status

build-control-plane: ## Only build the control plane binaries into the cache
	bash tests/control-plane/control-plane.sh build

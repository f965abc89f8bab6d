# shellcheck shell=bash
# Helpers of the cluster e2e scripts (sourced): test/e2e's, plus the
# versions of what only the cluster test builds. The run's state is in
# $WORK/run-cluster, so that make e2e and make e2e-cluster share the build
# cache ($WORK) but not a run directory.
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../e2e/lib.sh"
CLUSTER_DIR=$REPO/test/e2e-cluster
RUN=$WORK/run-cluster

ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
MULTUS_VERSION=${MULTUS_VERSION:-v4.3.0}
WHEREABOUTS_VERSION=${WHEREABOUTS_VERSION:-v0.9.2}
NAD_CLIENT_VERSION=${NAD_CLIENT_VERSION:-v1.7.7}

# shellcheck disable=SC2034 # used by the scripts that source this file
FASTPATH_IMAGE=localhost/fastpath-e2e/fastpath:dev
WORKLOAD_IMAGE=localhost/fastpath-e2e/workload:1

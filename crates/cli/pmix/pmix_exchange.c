/*
 * The launcher's key-value exchange for `pagewise mpi` (crates/cli/src/mpi.rs), over PMIx:
 * the interface both Open MPI's mpirun and Slurm's srun (--mpi=pmix) serve to the processes
 * they start. A few calls with plain C types, so the Rust side needs no copy of PMIx's
 * structure layouts: this file is compiled against pmix.h by build.rs into a shared object
 * that `pagewise mpi` loads at run time (dlopen), so the pagewise binary itself does not
 * depend on libpmix.
 *
 * Every function returns a pmix_status_t: PMIX_SUCCESS (0) or a negative PMIx status, which
 * pw_pmix_error names.
 */
#include <pmix.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static pmix_proc_t self;

/* Connect to the launcher's PMIx server; this process's rank and the job's size. */
int pw_pmix_init(uint32_t *rank, uint32_t *size) {
    pmix_status_t rc = PMIx_Init(&self, NULL, 0);
    if (rc != PMIX_SUCCESS) return rc;
    pmix_proc_t job;
    PMIX_PROC_LOAD(&job, self.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *val = NULL;
    rc = PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &val);
    if (rc != PMIX_SUCCESS) return rc;
    if (val->type != PMIX_UINT32) {
        PMIX_VALUE_RELEASE(val);
        return PMIX_ERR_TYPE_MISMATCH;
    }
    *rank = self.rank;
    *size = val->data.uint32;
    PMIX_VALUE_RELEASE(val);
    return PMIX_SUCCESS;
}

/* How many processes of this job run on this node (PMIX_LOCAL_SIZE). */
int pw_pmix_local_size(uint32_t *local) {
    pmix_proc_t job;
    PMIX_PROC_LOAD(&job, self.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *val = NULL;
    pmix_status_t rc = PMIx_Get(&job, PMIX_LOCAL_SIZE, NULL, 0, &val);
    if (rc != PMIX_SUCCESS) return rc;
    if (val->type != PMIX_UINT32) {
        PMIX_VALUE_RELEASE(val);
        return PMIX_ERR_TYPE_MISMATCH;
    }
    *local = val->data.uint32;
    PMIX_VALUE_RELEASE(val);
    return PMIX_SUCCESS;
}

/* Publish key = value (a string) to every rank of the job, from the next fence on. */
int pw_pmix_put(const char *key, const char *value) {
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_STRING;
    v.data.string = (char *)value;
    /* PMIx_Put copies the value; v keeps pointing at the caller's string, never freed here. */
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
    if (rc != PMIX_SUCCESS) return rc;
    return PMIx_Commit();
}

/* Wait until every rank of the job arrives here, exchanging what each put before. */
int pw_pmix_fence(void) {
    pmix_proc_t all;
    PMIX_PROC_LOAD(&all, self.nspace, PMIX_RANK_WILDCARD);
    pmix_info_t info;
    bool collect = true;
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    pmix_status_t rc = PMIx_Fence(&all, 1, &info, 1);
    PMIX_INFO_DESTRUCT(&info);
    return rc;
}

/* The string rank `rank` put under `key`, copied NUL-terminated into buf (len bytes);
 * *needed is its length without the NUL. PMIX_ERR_NOT_FOUND: that rank put no such key;
 * PMIX_ERR_BAD_PARAM with *needed >= len: buf is too small. */
int pw_pmix_get(uint32_t rank, const char *key, char *buf, size_t len, size_t *needed) {
    pmix_proc_t p;
    PMIX_PROC_LOAD(&p, self.nspace, rank);
    pmix_value_t *val = NULL;
    pmix_status_t rc = PMIx_Get(&p, key, NULL, 0, &val);
    if (rc != PMIX_SUCCESS) return rc;
    if (val->type != PMIX_STRING || val->data.string == NULL) {
        PMIX_VALUE_RELEASE(val);
        return PMIX_ERR_TYPE_MISMATCH;
    }
    size_t n = strlen(val->data.string);
    *needed = n;
    if (n >= len) {
        PMIX_VALUE_RELEASE(val);
        return PMIX_ERR_BAD_PARAM;
    }
    memcpy(buf, val->data.string, n + 1);
    PMIX_VALUE_RELEASE(val);
    return PMIX_SUCCESS;
}

int pw_pmix_finalize(void) { return PMIx_Finalize(NULL, 0); }

const char *pw_pmix_error(int status) { return PMIx_Error_string(status); }

/* What libcuda.c and the file entry_points.py generates from cuda.h share. */
#ifndef STANDIN_ENTRY_POINTS_H
#define STANDIN_ENTRY_POINTS_H

#define STANDIN_HIDDEN __attribute__((visibility("hidden")))

/* one ABI of one driver function: its base name, the CUDA version it appeared in, itself */
struct standin_entry_point {
    const char *name;
    int version;
    void *fn;
};

struct standin_result_name {
    int value;
    const char *name;
};

/* ends with a null name / a value of -1 */
extern STANDIN_HIDDEN const struct standin_entry_point standin_entry_points[];
extern STANDIN_HIDDEN const struct standin_result_name standin_result_names[];

/* what a generated stub returns: CUDA_ERROR_NOT_SUPPORTED, traced with the stub's name */
STANDIN_HIDDEN int standin_unsupported(const char *name);

#endif

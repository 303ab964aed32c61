#ifndef STITCH_SYSTEM_SHIM_H
#define STITCH_SYSTEM_SHIM_H
/* Linux interfaces Glibc's Swift module does not export. */
#include <sys/xattr.h>
#include <fcntl.h>
#include <linux/falloc.h>

/* Reserves blocks for [offset, offset+length) without changing the file size. */
static inline int stitch_preallocate(int fd, long long offset, long long length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length);
}
#endif

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

/* Aligned 64-bit release store / acquire load, for the shared-memory written record (its words are read by
   the checkpoint thread while the transport thread stores them). */
#include <stdint.h>
static inline void stitch_store_release_i64(int64_t *pointer, int64_t value) {
    __atomic_store_n(pointer, value, __ATOMIC_RELEASE);
}
static inline int64_t stitch_load_acquire_i64(const int64_t *pointer) {
    return __atomic_load_n(pointer, __ATOMIC_ACQUIRE);
}
/* posix_spawn extensions (glibc >= 2.34) that <spawn.h> declares only under _GNU_SOURCE; the test support's
   child processes use them to start in a folder and to inherit no descriptor but 0, 1 and 2. */
#include <spawn.h>
extern int posix_spawn_file_actions_addchdir_np(posix_spawn_file_actions_t *__restrict actions,
                                                const char *__restrict path);
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);
static inline int stitch_spawn_add_chdir(posix_spawn_file_actions_t *actions, const char *path) {
    return posix_spawn_file_actions_addchdir_np(actions, path);
}
static inline int stitch_spawn_add_closefrom(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

/* The size of the terminal on `fd` (TIOCGWINSZ; ioctl is variadic, so Swift cannot call it). 0 on success. */
#include <sys/ioctl.h>
static inline int stitch_terminal_size(int fd, int *columns, int *rows) {
    struct winsize size;
    if (ioctl(fd, TIOCGWINSZ, &size) != 0) return -1;
    *columns = size.ws_col;
    *rows = size.ws_row;
    return 0;
}

#endif

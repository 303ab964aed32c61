#ifndef STITCH_CMICROHTTPD_SHIM_H
#define STITCH_CMICROHTTPD_SHIM_H
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <microhttpd.h>

// MHD_start_daemon, MHD_upgrade_action and MHD_get_connection_info are variadic, which Swift cannot call; these
// fixed-argument wrappers are the only way the daemon reaches them.

/// What `stitch serve` starts one listening socket with.
struct stitch_mhd_config {
    unsigned int flags;
    const struct sockaddr *address;
    unsigned int connection_limit;
    unsigned int per_ip_connection_limit;
    unsigned int connection_timeout;
    size_t memory_limit;
    size_t thread_stack_size;
    unsigned int thread_pool_size; // 0 or 1: one polling thread
    const char *tls_key;  // PEM, or NULL
    const char *tls_cert; // PEM, or NULL
};

static inline struct MHD_Daemon *stitch_mhd_start(
    const struct stitch_mhd_config *config, MHD_AcceptPolicyCallback accept_policy, void *accept_policy_cls,
    MHD_AccessHandlerCallback handler, void *handler_cls, MHD_RequestCompletedCallback completed,
    void *completed_cls) {
    struct MHD_OptionItem options[14];
    int n = 0;
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void *)config->address};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, (intptr_t)config->connection_limit, NULL};
    if (config->per_ip_connection_limit > 0)
        options[n++] = (struct MHD_OptionItem){
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (intptr_t)config->per_ip_connection_limit, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)config->connection_timeout, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)config->memory_limit, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_STACK_SIZE, (intptr_t)config->thread_stack_size, NULL};
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, completed_cls};
    if (config->thread_pool_size > 1)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)config->thread_pool_size, NULL};
    if (config->tls_key && config->tls_cert) {
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)config->tls_key};
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)config->tls_cert};
    }
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    return MHD_start_daemon(config->flags, 0, accept_policy, accept_policy_cls, handler, handler_cls,
                            MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

/// The port a daemon listens on (useful after binding port 0); 0 when unknown.
static inline uint16_t stitch_mhd_port(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : 0;
}

/// The peer's address of a connection, or NULL.
static inline const struct sockaddr *stitch_mhd_client_address(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    return info ? info->client_addr : NULL;
}

/// Closes an upgraded (WebSocket) connection's socket, as MHD requires instead of close().
static inline int stitch_mhd_upgrade_close(struct MHD_UpgradeResponseHandle *handle) {
    return MHD_upgrade_action(handle, MHD_UPGRADE_ACTION_CLOSE) == MHD_YES ? 0 : -1;
}
#endif

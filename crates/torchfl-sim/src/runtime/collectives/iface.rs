//! Which local address the collectives transport listens on, chosen the way
//! NCCL chooses its socket interface, so that ranks on other hosts can
//! reach it.
//!
//! - `TORCH_FL_SIM_SOCKET_IFNAME` names the interface, in the syntax of
//!   `NCCL_SOCKET_IFNAME`: a comma-separated list of name prefixes
//!   (`eth,ens`), exact names with a leading `=` (`=eth0`), or, after a
//!   leading `^`, prefixes to avoid (`^docker,lo`).
//! - Without it, the interface that routes to the host to be reached: for a
//!   rank joining a group, the group's rendezvous (its address travels in
//!   the unique id); for the process that creates the id, torch.distributed's
//!   rendezvous host `MASTER_ADDR` (set by `torchrun` and the usual
//!   launchers). A loopback destination gives loopback, so ranks that all
//!   run on one host never leave it.
//! - Without either (a launcher that sets no `MASTER_ADDR`), loopback: one
//!   host is the only safe guess, and the variable covers the rest.
//!
//! An interface's addresses come from `getifaddrs`; the route to an address
//! from a connected UDP socket, which sends nothing.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs, UdpSocket};

use crate::error::{Error, Result};

/// The variable naming the interface (NCCL_SOCKET_IFNAME's syntax).
pub const IFNAME_ENV: &str = "TORCH_FL_SIM_SOCKET_IFNAME";
/// torch.distributed's rendezvous host, the default route's destination.
const MASTER_ADDR_ENV: &str = "MASTER_ADDR";

/// The address to listen on. `toward` is the host this rank must reach
/// (the group's rendezvous), or `None` for the process creating the group,
/// which then routes toward `MASTER_ADDR`.
pub(crate) fn listen_addr(toward: Option<IpAddr>) -> Result<IpAddr> {
    if let Some(spec) = std::env::var(IFNAME_ENV).ok().filter(|s| !s.trim().is_empty()) {
        let prefer_v6 = toward.is_some_and(|a| a.is_ipv6());
        return by_name(&Spec::parse(&spec), prefer_v6, &interfaces()?).ok_or_else(|| {
            let seen: Vec<String> = interfaces()
                .unwrap_or_default()
                .into_iter()
                .map(|i| format!("{} {}{}", i.name, i.addr, if i.up { "" } else { " (down)" }))
                .collect();
            Error::precondition(format!(
                "sim: {IFNAME_ENV}={spec:?} matches no interface that is up with a usable address (this host has: \
                 {}); name one of them, as for NCCL_SOCKET_IFNAME",
                if seen.is_empty() { "none".to_owned() } else { seen.join(", ") }
            ))
        });
    }
    let target = match toward {
        Some(a) => a,
        None => match master_addr()? {
            Some(a) => a,
            None => return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        },
    };
    if target.is_loopback() {
        return Ok(target);
    }
    route_to(target).map_err(|e| {
        Error::precondition(format!(
            "sim: no route to {target} to find the interface the collectives should listen on ({e}); set \
             {IFNAME_ENV} to the interface that reaches the other hosts"
        ))
    })
}

/// `MASTER_ADDR` resolved to an address; `None` when it is not set.
fn master_addr() -> Result<Option<IpAddr>> {
    let Some(host) = std::env::var(MASTER_ADDR_ENV).ok().filter(|s| !s.trim().is_empty()) else {
        return Ok(None);
    };
    let host = host.trim();
    if let Ok(a) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return Ok(Some(a));
    }
    let resolved = (host, 0u16).to_socket_addrs().map_err(|e| {
        Error::precondition(format!(
            "sim: {MASTER_ADDR_ENV}={host:?} does not resolve ({e}); set it to the rendezvous host's address, or \
             set {IFNAME_ENV} to the interface that reaches the other hosts"
        ))
    })?;
    let addrs: Vec<IpAddr> = resolved.map(|s| s.ip()).collect();
    // IPv4 first, as a resolver's order is not a preference for a route.
    Ok(addrs.iter().find(|a| a.is_ipv4()).or_else(|| addrs.first()).copied())
}

/// The local address the kernel would send from to reach `target`.
fn route_to(target: IpAddr) -> std::io::Result<IpAddr> {
    let any =
        if target.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
    let socket = UdpSocket::bind((any, 0))?;
    // The discard port; connect() on UDP only picks the route.
    socket.connect((target, 9))?;
    Ok(socket.local_addr()?.ip())
}

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Iface {
    pub name: String,
    pub addr: IpAddr,
    pub up: bool,
}

/// An interface selection in NCCL_SOCKET_IFNAME's syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    exclude: bool,
    /// (exact, name)
    names: Vec<(bool, String)>,
}

impl Spec {
    pub(crate) fn parse(spec: &str) -> Self {
        let spec = spec.trim();
        let (exclude, rest) = match spec.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, spec),
        };
        let names = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| match n.strip_prefix('=') {
                Some(exact) => (true, exact.to_owned()),
                None => (false, n.to_owned()),
            })
            .collect();
        Self { exclude, names }
    }

    pub(crate) fn matches(&self, name: &str) -> bool {
        let hit =
            self.names.iter().any(|(exact, n)| if *exact { name == n } else { name.starts_with(n.as_str()) });
        hit != self.exclude
    }
}

/// The first usable address of an interface `spec` selects: an interface
/// that is up, in the order `getifaddrs` lists them, IPv4 before IPv6
/// unless `prefer_v6`; never an IPv6 link-local address (it needs a scope
/// the unique id does not carry), and loopback only when named.
pub(crate) fn by_name(spec: &Spec, prefer_v6: bool, ifaces: &[Iface]) -> Option<IpAddr> {
    let usable = |i: &&Iface| {
        i.up && spec.matches(&i.name)
            && !(spec.exclude && i.addr.is_loopback())
            && !matches!(i.addr, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80)
    };
    let family = |v6: bool| ifaces.iter().filter(usable).find(|i| i.addr.is_ipv6() == v6).map(|i| i.addr);
    family(prefer_v6).or_else(|| family(!prefer_v6))
}

/// Every interface address of this host (IPv4 and IPv6).
pub(crate) fn interfaces() -> Result<Vec<Iface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head (or leaves it NULL on failure)
    // to the pointer it is given, which is a valid local.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::internal(format!(
            "sim: getifaddrs failed ({}); set {IFNAME_ENV} or MASTER_ADDR",
            std::io::Error::last_os_error()
        )));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, which
        // stays valid until freeifaddrs below.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: non-NULL; ifa_addr points to a sockaddr whose family
        // says which larger struct it is, read only for that family.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        // SAFETY: non-NULL, a NUL-terminated name owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        let up = ifa.ifa_flags & (libc::IFF_UP as u32) != 0;
        out.push(Iface { name, addr, up });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str, up: bool) -> Iface {
        Iface { name: name.to_owned(), addr: addr.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), up }
    }

    fn host() -> Vec<Iface> {
        vec![
            iface("lo", "127.0.0.1", true),
            iface("docker0", "172.17.0.1", true),
            iface("eth0", "fe80::1", true),
            iface("eth0", "2001:db8::5", true),
            iface("eth0", "198.18.0.5", true),
            iface("eth1", "198.19.0.5", false),
            iface("ens3", "198.18.1.5", true),
        ]
    }

    fn pick(spec: &str, v6: bool) -> Option<String> {
        by_name(&Spec::parse(spec), v6, &host()).map(|a| a.to_string())
    }

    #[test]
    fn prefixes_exact_names_and_exclusions_select_as_nccl_does() {
        assert_eq!(pick("eth", false).as_deref(), Some("198.18.0.5"));
        assert_eq!(pick("ens,eth", false).as_deref(), Some("198.18.0.5"), "listing order of the host wins");
        assert_eq!(pick("=eth", false), None, "an exact name is not a prefix");
        assert_eq!(pick("=ens3", false).as_deref(), Some("198.18.1.5"));
        assert_eq!(pick("^docker,lo", false).as_deref(), Some("198.18.0.5"));
        assert_eq!(
            pick("^docker,eth", false).as_deref(),
            Some("198.18.1.5"),
            "exclusions never give loopback"
        );
        assert_eq!(pick("lo", false).as_deref(), Some("127.0.0.1"), "loopback when named");
    }

    #[test]
    fn down_interfaces_and_link_local_addresses_are_never_chosen() {
        assert_eq!(pick("eth1", false), None);
        assert_eq!(pick("eth0", true).as_deref(), Some("2001:db8::5"));
        assert_eq!(pick("ens", true).as_deref(), Some("198.18.1.5"), "the other family when one is missing");
    }

    #[test]
    fn loopback_destinations_stay_on_loopback() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        if std::env::var(IFNAME_ENV).is_err() {
            assert_eq!(listen_addr(Some(lo)).ok(), Some(lo));
        }
    }

    #[test]
    fn this_host_lists_its_loopback_interface() {
        let all = interfaces().unwrap_or_default();
        assert!(all.iter().any(|i| i.addr.is_loopback()), "{all:?}");
    }
}

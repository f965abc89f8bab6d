// Package sriov is what is SR-IOV about a node's NIC functions: the PF↔VF
// relation as the PF's sysfs shows it (sriov_totalvfs, sriov_numvfs, the
// virtfnN links that give each VF its index) and the VF settings a PF
// holds for its VFs. It reads sysfs through pkg/pci; a VF's own side of
// the relation (its physfn link) is pkg/pci's, read while a scan has the
// VF open.
package sriov
